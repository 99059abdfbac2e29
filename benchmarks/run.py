"""Run every benchmark and print its table: `make bench`."""

import warnings

import allocator
import calibration
import compiled_matmul
import compiled_pointwise
import compiled_reductions
import data_movement
import device_overhead
import dynamic_sizes
import eager
import eager_cache
import launch
import launch_cost
import models
import queue_layer
import simulator

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")

if __name__ == "__main__":
    device_overhead.main()
    allocator.main()
    queue_layer.main()
    simulator.main()
    launch_cost.main()
    launch.main()
    calibration.main()
    compiled_pointwise.main()
    compiled_reductions.main()
    compiled_matmul.main()
    data_movement.main()
    models.main([])
    dynamic_sizes.main()
    eager.main([])
    eager_cache.main([])
