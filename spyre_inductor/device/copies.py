"""Copies to, from and within spyre, as typed operations on the current stream.

Dense copies of one dtype are Transfers (h2d, d2h, d2d pipelines); a
converting or strided copy within a device is a compiled program (the eager
path's copy_, spyre_inductor/eager/device_copy.py) when the compiler takes it;
anything else strided or converting runs as a host operation over the device bytes. A copy
that is not non_blocking waits for what it reads and writes. Non-blocking
host-to-device copies from pageable memory snapshot the source into a pinned
staging buffer first, as CUDA does; to pageable host memory they are
blocking, as on CUDA.

A copy that runs later (on a worker) captures the storages its tensors have
when it is enqueued: `param.data = other` (what Module.to does) or `set_()`
may give the same tensor object another storage before the copy runs.

Conjugate and negative views are bits on the tensor, not values in memory.
As PyTorch's own backends do, the copy moves the stored values and then
conjugates or negates the destination's stored values by whatever the two
tensors' bits differ in; materialising the source first would call this copy
again, without end.
"""

from __future__ import annotations

import ctypes

import torch

from spyre_runtime import _C
from spyre_runtime.queue import HostAddress, HostCallback, Transfer, TransferKind, in_host_operation

from . import queues

_lib: torch.library.Library | None = None


def _dense_same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape  # same numel is not enough: other shapes broadcast or raise, as on the CPU
        and a.is_contiguous()
        and b.is_contiguous()
    )


def _spyre(t: torch.Tensor) -> bool:
    return not t.is_cpu  # the kernel is only reached with spyre and CPU tensors


def _check_shapes(src: torch.Tensor, dst: torch.Tensor) -> None:
    # Checked here, not where the bytes move: a device copy may run later, on a worker, and the
    # caller must get CPU's error now.
    if src.shape != dst.shape:
        try:
            fits = torch.broadcast_shapes(dst.shape, src.shape) == dst.shape
        except RuntimeError:
            fits = False
        if not fits:
            raise RuntimeError(f"copy_: the source's shape {list(src.shape)} cannot be broadcast to the "
                               f"destination's shape {list(dst.shape)}")


def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    _C.check_copy_overlap(dst, src)  # (x[1:].copy_(x[:-1]): PyTorch's partial-overlap error)
    _check_shapes(src, dst)
    if dst.numel() == 0:
        return dst
    if src.is_conj() or dst.is_conj() or src.is_neg() or dst.is_neg():
        return _copy_resolving_bits(src, dst, non_blocking)
    if in_host_operation():
        # Inside an operation that already holds its place in stream order.
        _C.host_alias(dst).copy_(_C.host_alias(src))
        return dst
    if _spyre(src) and _spyre(dst):
        _device_to_device(src, dst)
    elif _spyre(dst):
        _host_to_device(src, dst, non_blocking)
    else:
        _device_to_host(src, dst, non_blocking)
    return dst


def _stored(t: torch.Tensor) -> torch.Tensor:
    """A view of `t`'s stored values: no conjugate or negative bit."""
    if t.is_conj():
        t = t.conj()  # the conjugate of a conjugate view is its memory as stored
    if t.is_neg():
        t = torch._neg_view(t)
    return t


def _copy_resolving_bits(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool) -> torch.Tensor:
    stored_dst = _stored(dst)
    conj, neg = src.is_conj() != dst.is_conj(), src.is_neg() != dst.is_neg()
    # A host destination is fixed up on this thread, so its copy must have landed first.
    copy_from(_stored(src), stored_dst, non_blocking and not ((conj or neg) and not _spyre(stored_dst)))
    if not (conj or neg):
        return dst

    def fix(values: torch.Tensor) -> None:
        if conj:
            values.conj_physical_()
        if neg:
            values.neg_()

    if _spyre(stored_dst):
        queues.run_on_host(stored_dst.device.index, lambda: fix(_C.host_alias(stored_dst)), writes=(stored_dst,),
                           name="copy: resolve conjugate/negative bits")
    else:
        fix(stored_dst)
    return dst


def _host_to_device(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool) -> None:
    device = dst.device.index
    q, stream = queues.queue(device), queues.current_stream(device)
    dense = _dense_same_layout(src, dst)
    nbytes = dst.numel() * dst.element_size()
    if not non_blocking:
        if dense:
            q.run_inline(stream, Transfer(TransferKind.H2D, HostAddress(src.data_ptr()), queues.address(dst), nbytes))
        else:
            queues.run_on_host(device, lambda: _C.host_alias(dst).copy_(src), writes=(dst,), name="h2d (strided)")
        return
    if dense and src.is_pinned():
        q.enqueue(stream, Transfer(TransferKind.H2D, HostAddress(src.data_ptr()), queues.address(dst), nbytes,
                                   keepalive=src.detach()))  # detach: today's storage, whatever `src` becomes
    elif dense:
        pool = queues.staging()
        buf = pool.acquire(nbytes)
        ctypes.memmove(buf.address, src.data_ptr(), nbytes)  # the copy sees the source as it is now
        ticket = q.enqueue(stream, Transfer(TransferKind.H2D, HostAddress(buf.address), queues.address(dst), nbytes))
        pool.release(buf, ticket)
    else:
        snapshot, dst = src.clone(), dst.detach()  # detach: fixed to today's storage
        q.enqueue(stream, HostCallback(lambda: _C.host_alias(dst).copy_(snapshot),
                                       queues.footprint(writes=(dst,)), name="h2d (strided)"))


def _device_to_host(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool) -> None:
    device = src.device.index
    q, stream = queues.queue(device), queues.current_stream(device)
    dense = _dense_same_layout(src, dst)
    nbytes = src.numel() * src.element_size()
    if non_blocking and dst.is_pinned():
        if dense:
            q.enqueue(stream, Transfer(TransferKind.D2H, queues.address(src), HostAddress(dst.data_ptr()), nbytes,
                                       keepalive=dst.detach()))  # detach: today's storage
        else:
            src, dst = src.detach(), dst.detach()  # fixed to today's storages
            q.enqueue(stream, HostCallback(lambda: dst.copy_(_C.host_alias(src)),
                                           queues.footprint(reads=(src,)), name="d2h (strided)"))
    elif dense:
        q.run_inline(stream, Transfer(TransferKind.D2H, queues.address(src), HostAddress(dst.data_ptr()), nbytes))
    else:
        queues.run_on_host(device, lambda: dst.copy_(_C.host_alias(src)), reads=(src,), name="d2h (strided)")


def _device_to_device(src: torch.Tensor, dst: torch.Tensor) -> None:
    device = dst.device.index
    if src.device != dst.device:
        # Footprints do not cross devices: wait until the source device has finished what
        # writes the source (its current stream's earlier work and other streams' writers),
        # then copy in the destination's stream order, against the destination's streams.
        queues.run_on_host(src.device.index, lambda: None, reads=(src,), name="d2d (cross-device): source ready")
        queues.run_on_host(device, lambda: _C.host_alias(dst).copy_(_C.host_alias(src)),
                           writes=(dst,), name="d2d (cross-device)")
        return
    q, stream = queues.queue(device), queues.current_stream(device)
    if _dense_same_layout(src, dst):
        nbytes = src.numel() * src.element_size()
        q.enqueue(stream, Transfer(TransferKind.D2D, queues.address(src), queues.address(dst), nbytes))
    elif _compiled_copy(src, dst):
        pass  # a cast or relayout: one compiled program (spyre_inductor/eager/device_copy.py)
    else:
        src, dst = src.detach(), dst.detach()  # fixed to today's storages
        q.enqueue(stream, HostCallback(lambda: _C.host_alias(dst).copy_(_C.host_alias(src)),
                                       queues.footprint(reads=(src,), writes=(dst,)), name="d2d (strided)"))


def _compiled_copy(src: torch.Tensor, dst: torch.Tensor) -> bool:
    from spyre_inductor.eager.device_copy import try_copy

    return try_copy(src, dst)


def copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.shape != src.shape:
        dst.resize_(src.shape)
    return copy_from(src, dst, False)


def local_scalar_dense(t: torch.Tensor):
    return queues.run_on_host(t.device.index, lambda: _C.host_alias(t).item(), reads=(t,), name="item")


def install() -> None:
    global _lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("_copy_from", copy_from, "PrivateUse1")
    _lib.impl("_copy_from_and_resize", copy_from_and_resize, "PrivateUse1")
    _lib.impl("_local_scalar_dense", local_scalar_dense, "PrivateUse1")
    for key in ("Conjugate", "Negative"):  # the bits reach copy_from, which resolves them
        _lib.impl("_copy_from", torch.library.fallthrough_kernel, key)
        _lib.impl("_copy_from_and_resize", torch.library.fallthrough_kernel, key)
