// horovod_cpp — Apache-2.0
// horovod_cpp._core: the Python binding of the C++ API (pybind11).
//
// It knows nothing about PyTorch: a tensor arrives as (data pointer, dtype code, shape,
// device), so the module never links LibTorch and never needs rebuilding when PyTorch is
// upgraded. The Python layer (horovod_cpp.torch) keeps tensors alive until their handle has
// completed. Results whose size only the other ranks determine (allgather, alltoall) come back
// as ResultBuffer objects exposing the runtime's memory through the buffer protocol, so
// torch.frombuffer wraps them without a copy.
//
// Errors: a call rejected at enqueue raises ValueError for a bad argument, and
// HorovodPreconditionError, both a ValueError and a RuntimeError, for a call the runtime's state
// refuses (not initialized, a duplicate name in flight, dynamic process sets off), where
// horovod.torch raises a RuntimeError; everything that fails after negotiation, and shutdowns,
// raise HorovodInternalError (a RuntimeError), as horovod.torch does. Waiting releases the GIL.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "common/config/config.h"
#include "common/horovod.h"

namespace py = pybind11;

namespace {

// Set at module import: an exception type derived from RuntimeError, and one derived from
// both ValueError and RuntimeError.
PyObject* g_internal_error = nullptr;
PyObject* g_precondition_error = nullptr;

[[noreturn]] void Raise(const hvd::Status& s, bool at_enqueue) {
  PyObject* type = g_internal_error;
  if (s.code() == hvd::StatusCode::kInvalidArgument) {
    type = PyExc_ValueError;
  } else if (at_enqueue && s.code() == hvd::StatusCode::kFailedPrecondition) {
    type = g_precondition_error;
  }
  std::string text = s.message();
  // The core speaks C++ ("call hvd::Init() first"); Python users call hvd.init().
  for (const auto& [cpp, python] :
       {std::pair<std::string, std::string>{"hvd::Init()", "hvd.init()"},
        {"hvd::Shutdown()", "hvd.shutdown()"}}) {
    for (size_t at = text.find(cpp); at != std::string::npos; at = text.find(cpp, at)) {
      text.replace(at, cpp.size(), python);
    }
  }
  PyErr_SetString(type, text.c_str());
  throw py::error_already_set();
}

void Check(const hvd::Status& s, bool at_enqueue = true) {
  if (!s.ok()) Raise(s, at_enqueue);
}

template <typename T>
T Get(hvd::Result<T> r, bool at_enqueue = true) {
  if (!r.ok()) Raise(r.status(), at_enqueue);
  return std::move(r).value();
}

// (data_ptr, dtype code, shape, device, stream) from Python; stream: the caller's current
// cudaStream_t for CUDA tensors (0: the legacy default stream), ignored for CPU tensors.
using PyTensor = std::tuple<uintptr_t, int, std::vector<int64_t>, int, uintptr_t>;

hvd::TensorView ToView(const PyTensor& t) {
  const auto& [ptr, dtype, shape, device, stream] = t;
  hvd::TensorView v{reinterpret_cast<void*>(ptr), static_cast<hvd::DataType>(dtype), shape, device};
  v.stream = reinterpret_cast<void*>(stream);
  return v;
}

std::vector<hvd::TensorView> ToViews(const std::vector<PyTensor>& ts) {
  std::vector<hvd::TensorView> views;
  views.reserve(ts.size());
  for (const PyTensor& t : ts) views.push_back(ToView(t));
  return views;
}

hvd::AllreduceOptions Options(int op, double prescale, double postscale, int process_set,
                             int stats_group, std::vector<int32_t> stats_groups = {}) {
  return hvd::AllreduceOptions{static_cast<hvd::ReduceOp>(op), prescale,  postscale,
                               process_set, stats_group, std::move(stats_groups)};
}

// The reductions' Python arguments: positional as before, then an optional stats group.
#define HVD_REDUCTION_ARGS(first)                                                      \
  py::arg(first), py::arg("output"), py::arg("name"), py::arg("op"), py::arg("prescale"), \
      py::arg("postscale"), py::arg("process_set"), py::arg("stats_group") = -1,            \
      py::arg("notify") = -1
// ... grouped: one stats group per member, or none.
#define HVD_GROUPED_REDUCTION_ARGS                                                         \
  py::arg("inputs"), py::arg("outputs"), py::arg("name"), py::arg("op"), py::arg("prescale"), \
      py::arg("postscale"), py::arg("process_set"),                                         \
      py::arg("stats_groups") = std::vector<int32_t>{}, py::arg("notify") = -1

// Runtime-owned result memory, exposed as a writable 1-D byte buffer.
struct ResultBuffer {
  std::shared_ptr<void> data;
  int64_t bytes = 0;
};

// A runtime-allocated result in CUDA memory, handed to torch through
// __cuda_array_interface__ (torch.as_tensor keeps this object, and so the memory, alive).
struct DeviceBuffer {
  std::shared_ptr<void> data;
  std::string typestr;  // numpy-style, e.g. "<f4"
  std::vector<int64_t> shape;
};

std::string TypeStr(hvd::DataType t) {
  switch (t) {
    case hvd::DataType::kUInt8:
      return "|u1";
    case hvd::DataType::kInt8:
      return "|i1";
    case hvd::DataType::kInt32:
      return "<i4";
    case hvd::DataType::kInt64:
      return "<i8";
    case hvd::DataType::kFloat16:
      return "<f2";
    case hvd::DataType::kFloat32:
      return "<f4";
    case hvd::DataType::kFloat64:
      return "<f8";
    default:
      return "<i2";  // bfloat16 (numpy has none): the torch layer views the bits as bfloat16
  }
}

// ---- call sites ----
// Frames under these path prefixes (horovod_cpp's own Python package, torch's) are not the
// caller's: the call site is the first frame outside them, e.g. the user's `loss.backward()`
// for a gradient allreduce started by DistributedOptimizer's hook.
std::vector<std::string>& SkippedPrefixes() {
  static std::vector<std::string> prefixes;
  return prefixes;
}

// "file.py:42" of the innermost frame outside the skipped prefixes ("" without a frame).
// Reads the frame chain directly (no traceback, no inspect): a few hundred nanoseconds.
std::string PythonCallSite() {
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  if (frame == nullptr) return "";
  Py_INCREF(frame);
  std::string site;
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    Py_ssize_t size = 0;
    const char* file = PyUnicode_AsUTF8AndSize(code->co_filename, &size);
    bool skipped = false;
    if (file == nullptr) {
      PyErr_Clear();
      skipped = true;
    } else {
      for (const std::string& prefix : SkippedPrefixes()) {
        if (static_cast<size_t>(size) >= prefix.size() &&
            std::memcmp(file, prefix.data(), prefix.size()) == 0) {
          skipped = true;
          break;
        }
      }
    }
    if (!skipped) {
      site.assign(file, static_cast<size_t>(size));
      site += ':';
      site += std::to_string(PyFrame_GetLineNumber(frame));
    }
    Py_DECREF(code);
    PyFrameObject* back = skipped ? PyFrame_GetBack(frame) : nullptr;  // new reference
    Py_DECREF(frame);
    frame = back;
  }
  return site;
}

bool g_call_sites = true;  // set_call_sites(False): the latency benchmark's baseline

// Makes the caller's Python call site the current one for the enqueue it wraps.
struct PyCallSite : hvd::CallSiteScope {
  PyCallSite() : hvd::CallSiteScope(g_call_sites ? PythonCallSite() : std::string()) {}
};

// Completion notices: an operation enqueued with notify >= 0 posts that number here when it
// completes (from the core's callback: no Python, no GIL), and take_notices() hands them over.
// One consumer (the torch.distributed backend's completion thread) waits for all its
// operations at once, woken only by finished ones. Never destroyed: callbacks may run at exit.
struct Notices {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int64_t> posted;
  std::unordered_set<int64_t> ignored;  // waited for by their caller: not posted
};

Notices& TheNotices() {
  static Notices* notices = new Notices;
  return *notices;
}

void PostNotice(int64_t token) {
  Notices& n = TheNotices();
  {
    std::lock_guard<std::mutex> lock(n.mu);
    if (n.ignored.erase(token) > 0) return;
    n.posted.push_back(token);
  }
  n.cv.notify_one();
}

// The caller waits for this operation itself: its notice is dropped (or never posted), so the
// thread in take_notices is not woken for it (and does not take the GIL from the caller).
void IgnoreNotice(int64_t token) {
  Notices& n = TheNotices();
  std::lock_guard<std::mutex> lock(n.mu);
  for (auto it = n.posted.begin(); it != n.posted.end(); ++it) {
    if (*it == token) {
      n.posted.erase(it);
      return;
    }
  }
  n.ignored.insert(token);
}

hvd::StatusCallback NoticeOnCompletion(int64_t token) {
  if (token < 0) return nullptr;
  return [token](const hvd::Status&) { PostNotice(token); };
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "horovod_cpp core runtime (framework independent)";

  static py::exception<std::runtime_error> internal_error(m, "HorovodInternalError",
                                                          PyExc_RuntimeError);
  g_internal_error = internal_error.ptr();
  // Both bases: code written for horovod_cpp catches ValueError, code written for Horovod
  // catches RuntimeError.
  py::tuple precondition_bases = py::make_tuple(py::handle(PyExc_ValueError),
                                                py::handle(PyExc_RuntimeError));
  g_precondition_error = PyErr_NewExceptionWithDoc(
      "horovod_cpp._core.HorovodPreconditionError",
      "A call the runtime's state refuses (not initialized, a duplicate name in flight): a "
      "ValueError, and a RuntimeError as in horovod.torch.",
      precondition_bases.ptr(), nullptr);
  if (g_precondition_error == nullptr) throw py::error_already_set();
  m.attr("HorovodPreconditionError") = py::handle(g_precondition_error);

  py::class_<ResultBuffer>(m, "ResultBuffer", py::buffer_protocol())
      .def_buffer([](ResultBuffer& b) {
        return py::buffer_info(b.data.get(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {b.bytes}, {1});
      })
      .def("__len__", [](const ResultBuffer& b) { return b.bytes; });

  py::class_<DeviceBuffer>(m, "DeviceBuffer")
      .def_property_readonly("__cuda_array_interface__", [](const DeviceBuffer& b) {
        py::dict d;
        d["shape"] = py::tuple(py::cast(b.shape));
        d["typestr"] = b.typestr;
        d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(b.data.get()), false);
        d["version"] = 2;
        d["strides"] = py::none();
        d["stream"] = py::none();  // ordering is handled by wait_outputs' stream wait
        return d;
      });

  // ---- dtype and op codes (shared with the Python layer) ----
  py::dict dtypes;
  for (int i = 0; i < hvd::kNumDataTypes; ++i) {
    dtypes[hvd::DataTypeName(static_cast<hvd::DataType>(i))] = i;
  }
  m.attr("DTYPES") = dtypes;
  m.attr("AVERAGE") = static_cast<int>(hvd::ReduceOp::kAverage);
  m.attr("SUM") = static_cast<int>(hvd::ReduceOp::kSum);
  m.attr("ADASUM") = static_cast<int>(hvd::ReduceOp::kAdasum);
  m.attr("MIN") = static_cast<int>(hvd::ReduceOp::kMin);
  m.attr("MAX") = static_cast<int>(hvd::ReduceOp::kMax);
  m.attr("PRODUCT") = static_cast<int>(hvd::ReduceOp::kProduct);
  m.attr("CPU_DEVICE") = hvd::kCpuDevice;

  // ---- lifecycle and topology ----
  m.def(
      "init",
      [](const std::vector<std::vector<int>>& process_sets) {
        hvd::InitOptions options;
        options.process_sets = process_sets;
        hvd::Status s;
        {
          py::gil_scoped_release release;
          s = hvd::Init(options);
        }
        Check(s);
      },
      py::arg("process_sets") = std::vector<std::vector<int>>{});
  m.def("shutdown", [] {
    py::gil_scoped_release release;
    hvd::Shutdown().IgnoreError();
  });
  m.def("is_initialized", &hvd::IsInitialized);
  m.def("rank", [] { return Get(hvd::Rank()); });
  m.def("size", [] { return Get(hvd::Size()); });
  m.def("local_rank", [] { return Get(hvd::LocalRank()); });
  m.def("local_size", [] { return Get(hvd::LocalSize()); });
  m.def("cross_rank", [] { return Get(hvd::CrossRank()); });
  m.def("cross_size", [] { return Get(hvd::CrossSize()); });
  m.def("mpi_threads_supported", [] { return Get(hvd::MpiThreadsSupported()); });
  m.def("nccl_built", &hvd::NcclBuilt);
  m.def("gloo_built", &hvd::GlooBuilt);
  m.def("ccl_built", &hvd::CclBuilt);
  m.def("host_backend", [] { return Get(hvd::HostBackendName()); });
  // Every knob of common/config/knobs.def: hvdrun builds its flags from these (runner/mpirun.py).
  m.def("knobs", [] {
    py::list out;
    for (const hvd::KnobSpec& k : hvd::KnobTable()) {
      py::dict d;
      d["name"] = k.name;
      d["type"] = k.type;
      d["default"] = k.default_value;
      d["range"] = k.range;
      d["min"] = k.min;
      d["max"] = k.max;
      d["agree"] = k.agree;
      d["flag"] = k.flag;
      d["flag_alias"] = k.flag_alias;
      d["flag_scale"] = k.flag_scale;
      d["note"] = k.note;
      d["help"] = k.help;
      out.append(d);
    }
    return out;
  });

  m.def("start_timeline", [](const std::string& path, bool mark_cycles) {
    Check(hvd::StartTimeline(path, mark_cycles));
  });
  m.def("stop_timeline", [] { Check(hvd::StopTimeline()); });
  m.def("timeline_counter",
        [](const std::string& name, const std::vector<std::pair<std::string, double>>& values) {
          Check(hvd::TimelineCounter(name, values));
        });

  // ---- process sets ----
  m.def("process_set_ids", [] { return Get(hvd::ProcessSetIds()); });
  m.def("process_set_info", [](int id) {
    hvd::ProcessSetInfo info = Get(hvd::GetProcessSet(id));
    return py::make_tuple(info.ranks, info.rank, info.included);
  });
  m.def("add_process_set", [](const std::vector<int>& ranks) {
    hvd::Result<int32_t> id(hvd::Status::Internal("unset"));
    {
      py::gil_scoped_release release;
      id = hvd::AddProcessSet(ranks);
    }
    return Get(std::move(id));
  });
  m.def("remove_process_set", [](int id) {
    hvd::Status s;
    {
      py::gil_scoped_release release;
      s = hvd::RemoveProcessSet(id);
    }
    Check(s);
  });

  // ---- PowerSGD's fused passes (horovod_cpp/torch/powersgd.py): raw float32 buffers ----
  m.def("low_rank_orthogonalize", [](uintptr_t rows, int64_t r, int64_t n, double epsilon) {
    py::gil_scoped_release release;
    hvd::LowRankOrthogonalize(reinterpret_cast<float*>(rows), r, n, epsilon);
  });
  m.def("low_rank_start", [](uintptr_t matrix, uintptr_t error, uintptr_t qt, int64_t r,
                             int64_t n, int64_t m, uintptr_t pt, int threads) {
    py::gil_scoped_release release;
    hvd::LowRankStart(reinterpret_cast<float*>(matrix), reinterpret_cast<const float*>(error),
                      reinterpret_cast<const float*>(qt), r, n, m, reinterpret_cast<float*>(pt),
                      threads);
  });
  m.def("low_rank_finish", [](uintptr_t matrix, uintptr_t pt, uintptr_t qt, int64_t r,
                              int64_t n, int64_t m, uintptr_t out, int threads) {
    py::gil_scoped_release release;
    hvd::LowRankFinish(reinterpret_cast<float*>(matrix), reinterpret_cast<const float*>(pt),
                       reinterpret_cast<const float*>(qt), r, n, m, reinterpret_cast<float*>(out),
                       threads);
  });

  // ---- operations: each returns a handle ----
  m.def(
      "allreduce_async",
      [](const PyTensor& in, const PyTensor& out, const std::string& name, int op, double pre,
         double post, int ps, int stats, int64_t notify) {
        PyCallSite at;
        return Get(hvd::EnqueueAllreduce(ToView(in), ToView(out), name,
                                         Options(op, pre, post, ps, stats),
                                         NoticeOnCompletion(notify)));
      },
      HVD_REDUCTION_ARGS("input"));
  m.def(
      "grouped_allreduce_async",
      [](const std::vector<PyTensor>& ins, const std::vector<PyTensor>& outs,
         const std::string& name, int op, double pre, double post, int ps,
         const std::vector<int32_t>& stats, int64_t notify) {
        PyCallSite at;
        return Get(hvd::EnqueueGroupedAllreduce(ToViews(ins), ToViews(outs), name,
                                                Options(op, pre, post, ps, -1, stats),
                                                NoticeOnCompletion(notify)));
      },
      HVD_GROUPED_REDUCTION_ARGS);
  m.def(
      "broadcast_async",
      [](const PyTensor& in, const PyTensor& out, int root, const std::string& name, int ps,
         int64_t notify) {
        PyCallSite at;
        return Get(hvd::EnqueueBroadcast(ToView(in), ToView(out), root, name, ps,
                                         NoticeOnCompletion(notify)));
      },
      py::arg("input"), py::arg("output"), py::arg("root"), py::arg("name"),
      py::arg("process_set"), py::arg("notify") = -1);
  m.def("allgather_async", [](const PyTensor& in, const std::string& name, int ps) {
    PyCallSite at;
    return Get(hvd::EnqueueAllgather(ToView(in), name, ps));
  });
  m.def(
      "allgather_into_async",
      [](const PyTensor& in, const PyTensor& out, const std::string& name, int ps,
         int64_t notify) {
        PyCallSite at;
        return Get(hvd::EnqueueAllgatherInto(ToView(in), ToView(out), name, ps,
                                             NoticeOnCompletion(notify)));
      },
      py::arg("input"), py::arg("output"), py::arg("name"), py::arg("process_set"),
      py::arg("notify") = -1);
  m.def("grouped_allgather_async",
        [](const std::vector<PyTensor>& ins, const std::string& name, int ps) {
          PyCallSite at;
          return Get(hvd::EnqueueGroupedAllgather(ToViews(ins), name, ps));
        });
  m.def(
      "alltoall_async",
      [](const PyTensor& in, const std::vector<int64_t>& splits, const std::string& name, int ps,
         int64_t notify) {
        PyCallSite at;
        return Get(hvd::EnqueueAlltoall(ToView(in), splits, name, ps, NoticeOnCompletion(notify)));
      },
      py::arg("input"), py::arg("splits"), py::arg("name"), py::arg("process_set"),
      py::arg("notify") = -1);
  m.def(
      "reducescatter_async",
      [](const PyTensor& in, const PyTensor& out, const std::string& name, int op, double pre,
         double post, int ps, int stats, int64_t notify) {
        PyCallSite at;
        return Get(hvd::EnqueueReducescatter(ToView(in), ToView(out), name,
                                             Options(op, pre, post, ps, stats),
                                             NoticeOnCompletion(notify)));
      },
      HVD_REDUCTION_ARGS("input"));
  m.def(
      "grouped_reducescatter_async",
      [](const std::vector<PyTensor>& ins, const std::vector<PyTensor>& outs,
         const std::string& name, int op, double pre, double post, int ps,
         const std::vector<int32_t>& stats, int64_t notify) {
        PyCallSite at;
        return Get(hvd::EnqueueGroupedReducescatter(ToViews(ins), ToViews(outs), name,
                                                    Options(op, pre, post, ps, -1, stats),
                                                    NoticeOnCompletion(notify)));
      },
      HVD_GROUPED_REDUCTION_ARGS);
  // The squared norms measured into (process set, group) since the last call, which resets
  // them: (local_sq, reduced_sq, elements, tensors). See hvd::TakeGradStats.
  m.def("take_grad_stats", [](int ps, int group) {
    hvd::GradStats s = Get(hvd::TakeGradStats(ps, group));
    return py::make_tuple(s.local_sq, s.reduced_sq, s.elements, s.tensors);
  });
  // Every group of the set: {group: (local_sq, reduced_sq, elements, tensors)}.
  m.def("take_all_grad_stats", [](int ps) {
    py::dict out;
    for (const auto& [group, s] : Get(hvd::TakeAllGradStats(ps))) {
      out[py::int_(group)] = py::make_tuple(s.local_sq, s.reduced_sq, s.elements, s.tensors);
    }
    return out;
  });
  m.def("reducescatter_shape", [](const std::vector<int64_t>& shape, int ps) {
    return Get(hvd::ReducescatterShape(shape, ps));
  });
  m.def("join_async", [] {
    PyCallSite at;
    return Get(hvd::EnqueueJoin());
  });
  // Frames under these path prefixes are not the caller's call site (horovod_cpp.torch sets
  // its package and torch's). call_site(): what an operation submitted here would record.
  m.def("set_call_site_skip", [](const std::vector<std::string>& prefixes) {
    SkippedPrefixes() = prefixes;
  });
  m.def("call_site", [] { return PythonCallSite(); });
  m.def("set_call_sites", [](bool on) { g_call_sites = on; });
  m.def("barrier", [](int ps) {
    PyCallSite at;
    hvd::Status s;
    {
      py::gil_scoped_release release;
      s = hvd::Barrier(ps);
    }
    Check(s, /*at_enqueue=*/false);
  });

  // ---- completion ----
  // The numbers of operations enqueued with notify= that have completed since the last call,
  // in completion order; waits up to timeout seconds (negative: for good) for the first.
  m.def("take_notices", [](double timeout) {
    std::vector<int64_t> tokens;
    {
      py::gil_scoped_release release;
      Notices& n = TheNotices();
      std::unique_lock<std::mutex> lock(n.mu);
      auto ready = [&n] { return !n.posted.empty(); };
      if (timeout < 0) {
        n.cv.wait(lock, ready);
      } else {
        n.cv.wait_for(lock, std::chrono::duration<double>(timeout), ready);
      }
      tokens.assign(n.posted.begin(), n.posted.end());
      n.posted.clear();
    }
    return tokens;
  });
  m.def("post_notice", &PostNotice);  // wakes take_notices (e.g. to stop its thread)
  m.def("ignore_notice", &IgnoreNotice);
  m.def("poll", [](int64_t handle) { return Get(hvd::Poll(handle)); });
  m.def("wait", [](int64_t handle) {
    hvd::Status s;
    {
      py::gil_scoped_release release;
      s = hvd::Wait(handle);
    }
    if (s.code() == hvd::StatusCode::kInvalidArgument &&
        s.message().rfind("unknown handle", 0) == 0) {
      Raise(s, /*at_enqueue=*/true);  // a programming error: ValueError
    }
    Check(s, /*at_enqueue=*/false);
  });
  // Returns [(buffer, dtype code, shape, received splits, value)] per output.
  // stream: for CUDA operations, the cudaStream_t that will use the outputs; it is made to
  // wait for the operation (the calling thread does not wait for the GPU).
  m.def(
      "wait_outputs",
      [](int64_t handle, uintptr_t stream) {
        hvd::Result<std::vector<hvd::Output>> r(hvd::Status::Internal("unset"));
        {
          py::gil_scoped_release release;
          r = hvd::WaitOutputs(handle);
        }
        std::vector<hvd::Output> outputs = Get(std::move(r), /*at_enqueue=*/false);
        py::list result;
        for (hvd::Output& o : outputs) {
          if (o.ready_event) {
            Check(hvd::StreamWaitEvent(o, reinterpret_cast<void*>(stream)), /*at_enqueue=*/false);
          }
          py::object buffer = py::none();
          if (o.data && o.ready_event) {
            buffer = py::cast(DeviceBuffer{o.data, TypeStr(o.dtype), o.shape});
          } else if (o.data) {
            const int64_t bytes = hvd::NumElements(o.shape) * hvd::DataTypeSize(o.dtype);
            buffer = py::cast(ResultBuffer{o.data, bytes});
          }
          result.append(py::make_tuple(buffer, static_cast<int>(o.dtype), o.shape,
                                       o.received_splits, o.value));
        }
        return result;
      },
      py::arg("handle"), py::arg("stream") = 0);
}
