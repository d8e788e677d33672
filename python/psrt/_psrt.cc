// psrt._psrt: the C API (worker/c_api.h, libpsrt_c.so) for Python, as thin as
// it can be; every framework plugin goes through it. Buffers are passed as
// addresses (tensor.data_ptr()) and must stay alive until wait() returns.
// Waits release the GIL, so autograd and other threads run meanwhile.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "worker/c_api.h"

namespace py = pybind11;

namespace {

class PsrtError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename T>
T Check(T rc) {
  if (rc < 0) throw PsrtError(psrt_last_error());
  return rc;
}

std::vector<const char*> Names(const std::vector<std::string>& names) {
  std::vector<const char*> out;
  for (const std::string& n : names) out.push_back(n.c_str());
  return out;
}

template <typename T>
std::vector<T*> Pointers(const std::vector<uintptr_t>& addresses, size_t n, const char* what) {
  if (addresses.size() != n) {
    throw PsrtError(std::string(what) + ": one buffer per name is needed");
  }
  std::vector<T*> out;
  for (uintptr_t a : addresses) out.push_back(reinterpret_cast<T*>(a));
  return out;
}

class Client {
 public:
  Client() {
    py::gil_scoped_release release;
    client_ = psrt_connect_from_env();
    if (client_ == nullptr) {
      py::gil_scoped_acquire acquire;
      throw PsrtError(psrt_last_error());
    }
  }
  ~Client() { psrt_close(client_); }
  void finish() {
    py::gil_scoped_release release;
    psrt_finish(client_);
  }

  int rank() const { return psrt_rank(client_); }
  int num_workers() const { return psrt_num_workers(client_); }
  int active_workers() const { return psrt_active_workers(client_); }
  int num_servers() const { return psrt_num_servers(client_); }
  bool is_sync() const { return psrt_is_sync(client_) == 1; }
  bool averages() const { return psrt_averages(client_) == 1; }
  void every_worker_each_step() const { Check(psrt_every_worker_each_step(client_)); }
  void state_on_workers(bool saves_state) const {
    Check(psrt_state_on_workers(client_, saves_state ? 1 : 0));
  }
  void check_same(const std::string& what, uint32_t digest) {
    int rc;
    {
      py::gil_scoped_release release;
      rc = psrt_check_same(client_, what.c_str(), digest);
    }
    Check(rc);
  }
  int64_t restored_step() const { return psrt_restored_step(client_); }

  // An optimizer dict ({"name": ..., "lr": ...}) over its defaults.
  static psrt_optimizer Optimizer(const py::dict& optimizer) {
    const std::string kind = py::str(optimizer["name"]);
    psrt_optimizer o;
    Check(psrt_optimizer_defaults(kind.c_str(), 0.0, &o));
    auto get = [&](const char* key, double* out) {
      if (optimizer.contains(key)) *out = py::float_(optimizer[key]);
    };
    get("lr", &o.lr);
    get("momentum", &o.momentum);
    get("dampening", &o.dampening);
    get("weight_decay", &o.weight_decay);
    get("beta1", &o.beta1);
    get("beta2", &o.beta2);
    get("eps", &o.eps);
    get("lr_decay", &o.lr_decay);
    get("initial_accumulator_value", &o.initial_accumulator_value);
    get("l1", &o.l1);
    get("l2", &o.l2);
    get("ftrl_beta", &o.ftrl_beta);
    if (optimizer.contains("nesterov")) o.nesterov = py::bool_(optimizer["nesterov"]) ? 1 : 0;
    return o;
  }

  void register_variable(const std::string& name, const std::vector<int64_t>& shape, uintptr_t data,
                         const py::dict& optimizer, int push_compression, int pull_compression) {
    const psrt_optimizer o = Optimizer(optimizer);
    py::gil_scoped_release release;
    const int rc = psrt_register(client_, name.c_str(), shape.data(), static_cast<int>(shape.size()),
                                 reinterpret_cast<float*>(data), &o, push_compression, pull_compression);
    py::gil_scoped_acquire acquire;
    Check(rc);
  }

  int64_t push_pull(const std::vector<std::string>& names, const std::vector<uintptr_t>& grads,
                    const std::vector<uintptr_t>& outs, int64_t version) {
    std::vector<const char*> n = Names(names);
    std::vector<const float*> g = Pointers<const float>(grads, names.size(), "push_pull");
    std::vector<float*> o = Pointers<float>(outs, names.size(), "push_pull");
    return Check(psrt_push_pull(client_, static_cast<int>(n.size()), n.data(), g.data(), o.data(), version));
  }

  // The workers' mean or sum of float32 tensors (psrt_allreduce); returns,
  // per tensor, whether any worker had one, and the servers' aggregate over
  // the mean.
  std::pair<std::vector<bool>, int> allreduce(const std::vector<std::string>& names, const std::vector<int64_t>& sizes,
                              const std::vector<uintptr_t>& ins, const std::vector<uintptr_t>& outs, int op,
                              int compression) {
    std::vector<const char*> n = Names(names);
    std::vector<const float*> in = Pointers<const float>(ins, names.size(), "allreduce");
    std::vector<float*> out = Pointers<float>(outs, names.size(), "allreduce");
    if (sizes.size() != names.size()) throw PsrtError("allreduce: one size per name is needed");
    std::vector<int> given(names.size());
    int factor = 1, rc;
    {
      py::gil_scoped_release release;
      rc = psrt_allreduce(client_, static_cast<int>(n.size()), n.data(), sizes.data(), in.data(), out.data(),
                          given.data(), op, compression, &factor);
    }
    Check(rc);
    return {std::vector<bool>(given.begin(), given.end()), factor};
  }

  int64_t push(const std::vector<std::string>& names, const std::vector<uintptr_t>& grads, int64_t version) {
    std::vector<const char*> n = Names(names);
    std::vector<const float*> g = Pointers<const float>(grads, names.size(), "push");
    return Check(psrt_push(client_, static_cast<int>(n.size()), n.data(), g.data(), version));
  }

  int64_t pull(const std::vector<std::string>& names, const std::vector<uintptr_t>& outs, int64_t min_version) {
    std::vector<const char*> n = Names(names);
    std::vector<float*> o = Pointers<float>(outs, names.size(), "pull");
    return Check(psrt_pull(client_, static_cast<int>(n.size()), n.data(), o.data(), min_version));
  }

  void register_table(const std::string& name, int64_t dim, int64_t vocab, uint64_t seed, double init_std,
                      int64_t max_rows, int64_t evict_after_steps, int64_t evict_min_count,
                      const py::dict& optimizer, int push_compression, int pull_compression) {
    const psrt_optimizer o = Optimizer(optimizer);
    const psrt_table t{dim,      vocab,           seed, init_std, max_rows, evict_after_steps, evict_min_count,
                       push_compression, pull_compression};
    py::gil_scoped_release release;
    const int rc = psrt_register_table(client_, name.c_str(), &t, &o);
    py::gil_scoped_acquire acquire;
    Check(rc);
  }

  // Buffers by address (a tensor's data_ptr()); they live until wait().
  int64_t pull_rows(const std::string& table, uintptr_t ids, int64_t n, uintptr_t out, int64_t min_version) {
    return Check(psrt_pull_rows(client_, table.c_str(), reinterpret_cast<const int64_t*>(ids), n,
                                reinterpret_cast<float*>(out), min_version));
  }

  void assign_rows(const std::string& table, uintptr_t ids, int64_t n, uintptr_t values) {
    py::gil_scoped_release release;
    const int rc = psrt_assign_rows(client_, table.c_str(), reinterpret_cast<const int64_t*>(ids),
                                    n, reinterpret_cast<const float*>(values));
    py::gil_scoped_acquire acquire;
    Check(rc);
  }

  int64_t push_rows(const std::string& table, uintptr_t ids, int64_t n, uintptr_t grads, int64_t version) {
    return Check(psrt_push_rows(client_, table.c_str(), reinterpret_cast<const int64_t*>(ids), n,
                                reinterpret_cast<const float*>(grads), version));
  }

  void wait(int64_t handle) {
    int rc;
    {
      py::gil_scoped_release release;
      rc = psrt_wait(client_, handle);
    }
    Check(rc);
  }

  // The workers' state (worker/state_keys.h): bytes in, bytes out.
  py::bytes load_state(const std::string& name) {
    int64_t size = 0;
    std::string buf;
    int rc;
    {
      py::gil_scoped_release release;
      rc = psrt_state_load(client_, name.c_str(), nullptr, 0, &size);
      if (rc == 0) {
        buf.resize(static_cast<size_t>(size));
        rc = psrt_state_load(client_, name.c_str(), buf.data(), size, &size);
      }
    }
    Check(rc);
    return py::bytes(buf);
  }
  void save_state(const std::string& name, const py::bytes& state, int64_t step) {
    const std::string_view bytes = state;
    int rc;
    {
      py::gil_scoped_release release;
      rc = psrt_state_save(client_, name.c_str(), bytes.data(), static_cast<int64_t>(bytes.size()),
                           step);
    }
    Check(rc);
  }
  bool state_due(int64_t step, bool last) const {
    return Check(psrt_state_due(client_, step, last ? 1 : 0)) == 1;
  }

  int64_t pulled_version(const std::string& name) { return Check(psrt_pulled_version(client_, name.c_str())); }
  int64_t next_step(const std::string& name, int64_t last) {
    return Check(psrt_next_step(client_, name.c_str(), last));
  }

  void set_learning_rate(double lr, const std::string& variable) {
    py::gil_scoped_release release;
    const int rc = psrt_set_learning_rate(client_, variable.empty() ? nullptr : variable.c_str(), lr);
    py::gil_scoped_acquire acquire;
    Check(rc);
  }

 private:
  psrt_client* client_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(_psrt, m) {
  m.doc() = "psrt's C API (libpsrt_c.so) for Python plugins";
  py::register_exception<PsrtError>(m, "PsrtError", PyExc_RuntimeError);
  m.attr("COMPRESSION_JOB_DEFAULT") = static_cast<int>(PSRT_COMPRESSION_JOB_DEFAULT);
  m.attr("COMPRESSION_NONE") = static_cast<int>(PSRT_COMPRESSION_NONE);
  m.attr("COMPRESSION_FP16") = static_cast<int>(PSRT_COMPRESSION_FP16);
  m.attr("COMPRESSION_BF16") = static_cast<int>(PSRT_COMPRESSION_BF16);
  py::class_<Client>(m, "Client")
      .def(py::init<>(), "Connects to the job psrt-run started (its environment).")
      .def("finish", &Client::finish, "Sends this process's totals for the job's summary.")
      .def("rank", &Client::rank)
      .def("num_workers", &Client::num_workers)
      .def("active_workers", &Client::active_workers)
      .def("num_servers", &Client::num_servers)
      .def("is_sync", &Client::is_sync)
      .def("averages", &Client::averages)
      .def("every_worker_each_step", &Client::every_worker_each_step,
           "Raises PsrtError unless every sync step waits for every worker's push.")
      .def("restored_step", &Client::restored_step)
      .def("register_variable", &Client::register_variable, py::arg("name"), py::arg("shape"),
           py::arg("data"), py::arg("optimizer"), py::arg("push_compression") = 0,
           py::arg("pull_compression") = 0)
      .def("push_pull", &Client::push_pull)
      .def("allreduce", &Client::allreduce)
      .def("state_on_workers", &Client::state_on_workers, py::arg("saves_state") = false,
           "Raises PsrtError unless the weights and optimizer state may live on the workers "
           "(saves_state: the plugin keeps them in the job's checkpoints).")
      .def("check_same", &Client::check_same)
      .def("load_state", &Client::load_state,
           "The workers' state `name` the job restored (b'' if none); every worker, at start.")
      .def("save_state", &Client::save_state,
           "Rank 0's state of `step`, saved with the job's checkpoints; other ranks: nothing.")
      .def("state_due", &Client::state_due, py::arg("step"), py::arg("last") = false,
           "Whether a checkpoint saves `step` (last: the job's last step, its final checkpoint's).")
      .def("push", &Client::push)
      .def("pull", &Client::pull)
      .def("register_table", &Client::register_table, py::arg("name"), py::arg("dim"),
           py::arg("vocab"), py::arg("seed"), py::arg("init_std"), py::arg("max_rows"),
           py::arg("evict_after_steps"), py::arg("evict_min_count"), py::arg("optimizer"),
           py::arg("push_compression"), py::arg("pull_compression"))
      .def("pull_rows", &Client::pull_rows)
      .def("push_rows", &Client::push_rows)
      .def("assign_rows", &Client::assign_rows)
      .def("wait", &Client::wait)
      .def("pulled_version", &Client::pulled_version)
      .def("next_step", &Client::next_step, py::arg("name"), py::arg("last") = -1)
      .def("set_learning_rate", &Client::set_learning_rate, py::arg("lr"),
           py::arg("variable") = "");
}
