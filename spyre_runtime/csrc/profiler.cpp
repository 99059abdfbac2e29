// The spyre activity profiler: what torch.profiler shows of the simulated card.
//
// PyTorch's extension point for a PrivateUse1 device's trace is a Kineto plugin: an
// IActivityProfiler registered through PrivateUse1ProfilerRegistry (the registry needs C++, so
// this file is C++; everything it reports comes from the Python queue layer). A profiling
// session asks Python to record the device's operations (start), to stop (stop), and for the
// operations recorded (processTrace): each becomes a Kineto activity on the device's tracks,
// linked to the CPU op that enqueued it by the correlation id Kineto pushed on that op's thread,
// so key_averages() counts its simulated duration as device time of that op.
#define USE_KINETO 1
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/extension.h>

#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace py = pybind11;

namespace spyre::profiler {
namespace {

using libkineto::ActivityType;

std::mutex hooks_mutex;
py::object* hooks = nullptr;  // (start, stop, collect) from Python; leaked: lives as long as the process

// Kineto pushes each CPU op's correlation id on the thread running it; a user scope's
// (record_function, Inductor's "## Call CompiledFxGraph") on a stack of its own
thread_local std::vector<uint64_t> correlation_stack;
thread_local std::vector<uint64_t> user_correlation_stack;

py::object hook(int k) {
  std::lock_guard<std::mutex> lock(hooks_mutex);
  if (hooks == nullptr) return py::none();
  return py::reinterpret_borrow<py::tuple>(*hooks)[k];
}

const std::set<ActivityType>& kinds() {
  static const std::set<ActivityType> k{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                        ActivityType::PRIVATEUSE1_RUNTIME};
  return k;
}

class Session : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    call(0, "start");
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    call(1, "stop");
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return errors_; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t, int64_t) override {
    {
      py::gil_scoped_acquire gil;
      py::object f = hook(2);
      if (f.is_none()) return;
      auto& buffer = *buffer_;
      try {
        // each: (name, kind, device, track, start_ns, end_ns, correlation, {key: value})
        for (py::handle item : f()) {
          auto t = item.cast<py::tuple>();
          auto kind = t[1].cast<std::string>();
          ActivityType type = kind == "kernel"   ? ActivityType::CONCURRENT_KERNEL
                              : kind == "memcpy" ? ActivityType::GPU_MEMCPY
                                                 : ActivityType::PRIVATEUSE1_RUNTIME;
          buffer.emplace_activity(buffer.span, type, t[0].cast<std::string>());
          auto& a = *buffer.activities.back();
          a.device = t[2].cast<int32_t>();
          a.resource = t[3].cast<int32_t>();
          a.startTime = t[4].cast<int64_t>();
          a.endTime = t[5].cast<int64_t>();
          a.id = t[6].cast<int64_t>();
          if (linked && a.id > 0) a.linked = linked(static_cast<int32_t>(a.id));
          for (auto kv : t[7].cast<py::dict>()) {
            auto key = kv.first.cast<std::string>();
            auto value = kv.second.cast<std::string>();
            a.addMetadataQuoted(key, value);
            if (key == "pipeline") tracks_[{a.device, a.resource}] = "pipeline " + value;
          }
        }
      } catch (const std::exception& e) {  // (py::error_already_set among them: Kineto sees none)
        errors_.push_back(std::string("spyre profiler: ") + e.what());
      }
    }
    for (auto& a : buffer_->activities) logger.handleGenericActivity(*a);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    if (tracks_.empty()) return nullptr;
    int64_t device = tracks_.begin()->first.first;
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{
        device, 5000000 + device, "spyre:" + std::to_string(device), "spyre (simulated durations)"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (auto& [key, name] : tracks_) out.push_back({key.second, key.second, key.first, name});
    return out;
  }

  // The buffer itself, not a move of it: each activity points at its span, which must live as
  // long as Kineto keeps the activities (the session may go first).
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    auto out = std::move(buffer_);
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    return out;
  }

  void pushCorrelationId(uint64_t id) override { correlation_stack.push_back(id); }
  void popCorrelationId() override {
    if (!correlation_stack.empty()) correlation_stack.pop_back();
  }
  void pushUserCorrelationId(uint64_t id) override { user_correlation_stack.push_back(id); }
  void popUserCorrelationId() override {
    if (!user_correlation_stack.empty()) user_correlation_stack.pop_back();
  }

 private:
  void call(int k, const char* what) {
    py::gil_scoped_acquire gil;
    try {
      py::object f = hook(k);
      if (!f.is_none()) f();
    } catch (const std::exception& e) {
      errors_.push_back(std::string("spyre profiler ") + what + ": " + e.what());
    }
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
  std::vector<std::string> errors_;
  std::map<std::pair<int64_t, int64_t>, std::string> tracks_;  // (device, track) -> its pipeline
};

class ActivityProfiler : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return kinds(); }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& types,
                                                                 const libkineto::Config&) override {
    // Only when the device's activities are asked for: PyTorch's CPU-only profile asks for
    // PRIVATEUSE1_RUNTIME too (among its host types), and must not record the device.
    if (types.count(ActivityType::CONCURRENT_KERNEL) || types.count(ActivityType::GPU_MEMCPY)) {
      return std::make_unique<Session>();
    }
    return nullptr;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"spyre"};
};

}  // namespace

void set_hooks(py::object start, py::object stop, py::object collect) {
  std::lock_guard<std::mutex> lock(hooks_mutex);
  if (hooks == nullptr) hooks = new py::object();
  *hooks = py::make_tuple(std::move(start), std::move(stop), std::move(collect));
}

// The correlation id of the CPU op this thread is in (0: none, or no profiling session).
// (the innermost: an aten op's, else a user scope's; ids of both come from one counter)
uint64_t current_correlation() {
  if (!correlation_stack.empty()) return correlation_stack.back();
  return user_correlation_stack.empty() ? 0 : user_correlation_stack.back();
}

void register_profiler() {
  static bool done = false;
  if (done) return;
  done = true;
  torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().registerFactory(
      [] { return std::unique_ptr<libkineto::IActivityProfiler>(new ActivityProfiler()); });
}

}  // namespace spyre::profiler
