// The C ABI of include/kpa/kpa.h: raw pointers wrapped as unmanaged Views of the execution space
// the calling thread chose (kpa_set_execution: the default space, on a stream of its own or not,
// or the host back end), the C++ entry points behind them, exceptions turned into status codes,
// and every call run on the thread that owns Kokkos, whichever thread makes it.

#include <kpa/kpa.h>
#include <kpa/kpa.hpp>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

using DefaultSpace = Kokkos::DefaultExecutionSpace;
using HostSpace = Kokkos::DefaultHostExecutionSpace;
/// Whether the host back end is another space than the default one (a GPU build).
constexpr bool kSeparateHostSpace = !std::is_same_v<DefaultSpace, HostSpace>;
template <class Space, class DataType>
using Unmanaged = Kokkos::View<DataType, Kokkos::LayoutRight, typename Space::memory_space,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class T>
struct Tag {
  using type = T;
};

thread_local std::string last_error;
std::atomic<bool> check_indices{true};  // kpa_set_check_indices

/// Where a thread's calls run (kpa_set_execution).
struct Execution {
  int memory = KPA_MEMORY_DEFAULT;  ///< a kpa_memory value
  void* stream = nullptr;           ///< a cudaStream_t on GPU builds; nullptr: synchronous calls
};
thread_local Execution execution;

/// A call's outcome, carried back to the calling thread (whose kpa_last_error reports it).
struct Outcome {
  int status = KPA_OK;
  std::string message;
};

/// The thread that owns a Kokkos kpa_init started. Kokkos' host back ends (OpenMP in 3.4) run
/// parallel work only from the thread that initialised them, so every C ABI call made from any
/// thread is handed to this one and waited for; concurrent calls take turns.
class KokkosThread {
 public:
  /// Starts the thread and runs `first` (Kokkos::initialize) on it; the thread ends if that fails.
  template <class Job>
  Outcome start(Job&& first) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      accepting_ = true;
    }
    thread_ = std::thread([this] { loop(); });
    id_ = thread_.get_id();
    Outcome outcome = run(std::forward<Job>(first));
    if (outcome.status != KPA_OK) stop([] { return Outcome{}; });
    return outcome;
  }

  /// Runs `job` on the thread and returns its outcome; once stop() has begun, refuses it.
  template <class Job>
  Outcome run(Job&& job) {
    std::packaged_task<Outcome()> task(std::forward<Job>(job));
    std::future<Outcome> result = task.get_future();
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (!accepting_) return Outcome{KPA_ERR_RUNTIME, "kpa: Kokkos is not initialised (call kpa_init first)"};
      jobs_.push_back(std::move(task));
    }
    wake_.notify_one();
    return result.get();
  }

  /// Runs `last` after every job already queued, then ends the thread.
  template <class Job>
  void stop(Job&& last) {
    std::packaged_task<Outcome()> task(std::forward<Job>(last));
    std::future<Outcome> done = task.get_future();
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(task));
      accepting_ = false;
    }
    wake_.notify_one();
    done.wait();
    thread_.join();
    id_ = std::thread::id();
  }

  bool is_current() const { return std::this_thread::get_id() == id_.load(); }

  /// A program that exits without kpa_finalize: the thread ends (Kokkos is left as it is, the
  /// process is ending), rather than being destroyed while it waits.
  ~KokkosThread() {
    if (!thread_.joinable()) return;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      accepting_ = false;
    }
    wake_.notify_one();
    thread_.join();
  }

 private:
  void loop() {
    for (;;) {
      std::packaged_task<Outcome()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return !accepting_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopped, nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::thread thread_;
  std::atomic<std::thread::id> id_{};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<Outcome()>> jobs_;
  bool accepting_ = false;
};

/// Who owns Kokkos: nobody yet, kpa (through kpa_init, on a KokkosThread), or the host program
/// (which initialised Kokkos before kpa_init; calls then run on the calling thread).
enum class Owner { None, Kpa, Host };
std::mutex lifetime_mutex;  // kpa_init and kpa_finalize
std::atomic<Owner> owner{Owner::None};
KokkosThread kokkos_thread;
std::mutex workspace_mutex;  // kpa_paged_attention callers share the workspaces

/// The automatic entry points' workspace on `Space`, held under workspace_mutex and released
/// before Kokkos finalises.
template <class Space>
std::unique_ptr<kpa::Workspace<Space>>& workspace_of() {
  static std::unique_ptr<kpa::Workspace<Space>> workspace;
  return workspace;
}

template <class Space>
kpa::Workspace<Space>& workspace_for(const Space&) {
  auto& workspace = workspace_of<Space>();
  if (!workspace) workspace = std::make_unique<kpa::Workspace<Space>>();
  return *workspace;
}

/// The instances of the default space that run on callers' streams, one per stream, made at a
/// stream's first call (an instance allocates its own reduction and team scratch) and kept until
/// Kokkos finalises. Only GPU builds have any.
template <class Space>
struct StreamInstances {
  static Space of(void*) { return Space(); }
  static void clear() {}
};

#ifdef KOKKOS_ENABLE_CUDA
template <>
struct StreamInstances<Kokkos::Cuda> {
  static Kokkos::Cuda of(void* stream) {
    const std::lock_guard<std::mutex> lock(mutex());
    auto& map = instances();
    auto found = map.find(stream);
    if (found == map.end()) found = map.emplace(stream, Kokkos::Cuda(static_cast<cudaStream_t>(stream))).first;
    return found->second;
  }
  static void clear() {
    const std::lock_guard<std::mutex> lock(mutex());
    instances().clear();
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<void*, Kokkos::Cuda>& instances() {
    static std::map<void*, Kokkos::Cuda> map;
    return map;
  }
};
#endif

/// What kpa holds on Kokkos' behalf, released before Kokkos finalises.
void release_kokkos_resources() {
  {
    const std::lock_guard<std::mutex> workspace_lock(workspace_mutex);
    workspace_of<DefaultSpace>().reset();
    workspace_of<HostSpace>().reset();
  }
  StreamInstances<DefaultSpace>::clear();
}

/// Thrown for argument errors found by this layer itself.
struct InvalidArgument : std::invalid_argument {
  kpa_status status;
  InvalidArgument(kpa_status s, const std::string& message) : std::invalid_argument(message), status(s) {}
};

[[noreturn]] void invalid(const char* call, const std::string& what, kpa_status status = KPA_ERR_INVALID_ARGUMENT) {
  throw InvalidArgument(status, std::string(call) + ": " + what);
}

int to_int(const char* call, const char* name, int64_t value, bool allow_zero = true) {
  if (value < (allow_zero ? 0 : 1) || value > INT_MAX) {
    invalid(call, std::string(name) + " = " + std::to_string(value) + " is outside [" + (allow_zero ? "0" : "1") +
                      ", " + std::to_string(INT_MAX) + "]");
  }
  return static_cast<int>(value);
}

void require(const char* call, const char* name, const void* pointer, bool needed = true) {
  if (needed && pointer == nullptr) invalid(call, std::string(name) + " is NULL");
}

/// Calls run(space) with the execution space instance `where` names.
template <class Run>
void on_space(const Execution& where, Run&& run) {
  if constexpr (kSeparateHostSpace) {
    if (where.memory == KPA_MEMORY_HOST) {
      run(HostSpace());
      return;
    }
  }
  if (where.stream != nullptr) {
    run(StreamInstances<DefaultSpace>::of(where.stream));
  } else {
    run(DefaultSpace());
  }
}

/// Runs body(space) where Kokkos lives (the KokkosThread, or here when the host program owns
/// Kokkos) on the space the calling thread chose, waits for it unless the thread gave a stream,
/// turns exceptions into a status, and leaves the message for this thread's kpa_last_error.
template <class Body>
int guarded(Body&& body) {
  const Execution where = execution;  // the calling thread's choice, whichever thread runs the call
  auto job = [&]() -> Outcome {
    try {
      if (!Kokkos::is_initialized()) {
        throw InvalidArgument(KPA_ERR_RUNTIME, "kpa: Kokkos is not initialised (call kpa_init first)");
      }
      on_space(where, [&](const auto& space) {
        body(space);
        if (where.stream == nullptr) space.fence();
      });
      return Outcome{};
    } catch (const InvalidArgument& e) {
      return Outcome{e.status, e.what()};
    } catch (const kpa::UnsupportedError& e) {
      return Outcome{KPA_ERR_UNSUPPORTED, e.what()};
    } catch (const kpa::Error& e) {
      return Outcome{KPA_ERR_INVALID_ARGUMENT, e.what()};
    } catch (const std::exception& e) {
      return Outcome{KPA_ERR_RUNTIME, std::string("kpa: ") + e.what()};
    } catch (...) {
      return Outcome{KPA_ERR_RUNTIME, "kpa: unknown error"};
    }
  };
  const Outcome outcome = owner.load() == Owner::Kpa && !kokkos_thread.is_current() ? kokkos_thread.run(job) : job();
  last_error = outcome.message;
  return outcome.status;
}

/// An enum argument (kpa_dtype, kpa_memory) as the int the caller passed. C callers may pass any
/// int, and C++ must not read an enum object holding a value outside the enum's range: copy its
/// bytes instead.
template <class Enum>
int enum_value(const Enum& e) {
  int value = 0;
  static_assert(sizeof value == sizeof e, "kpa's enums are int-sized");
  std::memcpy(&value, &e, sizeof value);
  return value;
}
int dtype_value(const kpa_dtype& dtype) { return enum_value(dtype); }

/// Bytes of one element of a kpa_dtype.
std::int64_t element_bytes(const char* call, int dtype) {
  switch (dtype) {
    case KPA_F32: return 4;
    case KPA_F16:
    case KPA_BF16: return 2;
    case KPA_FP8_E4M3:
    case KPA_FP8_E5M2: return 1;
    default: invalid(call, "cache_dtype " + std::to_string(dtype) + " is not a kpa_dtype", KPA_ERR_UNSUPPORTED);
  }
}

/// Calls run(Tag<memory space>) for a kpa_memory argument.
template <class Run>
void with_memory(const char* call, const char* name, const kpa_memory& memory, Run&& run) {
  switch (enum_value(memory)) {
    case KPA_MEMORY_DEFAULT: run(Tag<DefaultSpace::memory_space>{}); break;
    case KPA_MEMORY_HOST: run(Tag<Kokkos::HostSpace>{}); break;
    default: invalid(call, std::string(name) + " = " + std::to_string(enum_value(memory)) + " is not a kpa_memory");
  }
}

/// Calls run(Tag<activation type>, Tag<cache element>, kv_cache_dtype) for a (dtype, cache_dtype) pair.
template <class Run>
void with_types(const char* call, int dtype, int cache_dtype, Run&& run) {
  const bool fp8 = cache_dtype == KPA_FP8_E4M3 || cache_dtype == KPA_FP8_E5M2;
  if (!fp8 && cache_dtype != dtype) {
    invalid(call, "cache_dtype " + std::to_string(cache_dtype) + " must equal dtype " + std::to_string(dtype) +
                      " or be an fp8 type", KPA_ERR_UNSUPPORTED);
  }
  const kpa::KVCacheDType kv = cache_dtype == KPA_FP8_E4M3   ? kpa::KVCacheDType::Fp8E4M3
                               : cache_dtype == KPA_FP8_E5M2 ? kpa::KVCacheDType::Fp8E5M2
                                                             : kpa::KVCacheDType::Auto;
  auto with_cache = [&](auto t) {
    using T = typename decltype(t)::type;
    if (fp8) {
      run(t, Tag<std::uint8_t>{}, kv);
    } else {
      run(t, Tag<T>{}, kv);
    }
  };
  switch (dtype) {
    case KPA_F32: with_cache(Tag<float>{}); break;
    case KPA_F16: with_cache(Tag<kpa::half>{}); break;
    case KPA_BF16: with_cache(Tag<kpa::bfloat16>{}); break;
    default: invalid(call, "dtype " + std::to_string(dtype) + " is not F32, F16 or BF16", KPA_ERR_UNSUPPORTED);
  }
}

/// An attention call of the C ABI: the arguments every attention entry point takes (kpa.h's
/// order), and the scalars and variants as kpa_paged_attention_ex's options (v1, v2 and
/// kpa_paged_attention pass theirs as arguments: attention_options gathers them).
struct CAttentionArgs {
  const void* query;
  int dtype;  ///< a kpa_dtype value
  const void* key_cache;
  const void* value_cache;
  int cache_dtype;  ///< a kpa_dtype value
  int64_t num_seqs, num_heads, num_kv_heads, head_size, num_blocks, block_size;
  const int32_t* block_tables;
  int64_t max_blocks_per_seq;
  const int32_t* seq_lens;
  int64_t max_seq_len;
  kpa_attention_options options;

  CAttentionArgs(const void* query_, const kpa_dtype& dtype_, const void* key_cache_, const void* value_cache_,
                 const kpa_dtype& cache_dtype_, int64_t num_seqs_, int64_t num_heads_, int64_t num_kv_heads_,
                 int64_t head_size_, int64_t num_blocks_, int64_t block_size_, const int32_t* block_tables_,
                 int64_t max_blocks_per_seq_, const int32_t* seq_lens_, int64_t max_seq_len_,
                 const kpa_attention_options& options_)
      : query(query_),
        dtype(dtype_value(dtype_)),
        key_cache(key_cache_),
        value_cache(value_cache_),
        cache_dtype(dtype_value(cache_dtype_)),
        num_seqs(num_seqs_),
        num_heads(num_heads_),
        num_kv_heads(num_kv_heads_),
        head_size(head_size_),
        num_blocks(num_blocks_),
        block_size(block_size_),
        block_tables(block_tables_),
        max_blocks_per_seq(max_blocks_per_seq_),
        seq_lens(seq_lens_),
        max_seq_len(max_seq_len_),
        options(options_) {}
};

/// The options of an entry point that takes its scalars as arguments (v1, v2, kpa_paged_attention):
/// no variant beyond ALiBi and block-sparse, and the index check kpa_set_check_indices set.
kpa_attention_options attention_options(float scale, const float* alibi_slopes, float k_scale, float v_scale,
                                        int tp_rank, const kpa_block_sparse* block_sparse) {
  kpa_attention_options o;
  kpa_attention_options_init(&o);
  o.scale = scale;
  o.alibi_slopes = alibi_slopes;
  o.k_scale = k_scale;
  o.v_scale = v_scale;
  o.tp_rank = tp_rank;
  o.block_sparse = block_sparse;
  o.check_indices = check_indices.load() ? 1 : 0;
  return o;
}

/// Wraps the shared arguments as Views of `Space` and hands them to `call_kpa`.
template <class Space, class Body>
void with_attention_views(const char* call, const Space&, void* out, const CAttentionArgs& a, Body&& call_kpa) {
  const int seqs = to_int(call, "num_seqs", a.num_seqs);
  const int heads = to_int(call, "num_heads", a.num_heads, false);
  const int kv_heads = to_int(call, "num_kv_heads", a.num_kv_heads, false);
  const int head_size = to_int(call, "head_size", a.head_size, false);
  const int blocks = to_int(call, "num_blocks", a.num_blocks);
  const int block_size = to_int(call, "block_size", a.block_size, false);
  const int columns = to_int(call, "max_blocks_per_seq", a.max_blocks_per_seq);
  const int max_seq_len = to_int(call, "max_seq_len", a.max_seq_len);
  const kpa_attention_options& o = a.options;
  const int rows = o.num_tokens < 0 ? seqs : to_int(call, "num_tokens", o.num_tokens);
  const bool any_seqs = seqs > 0;
  require(call, "out", out, rows > 0);
  require(call, "query", a.query, rows > 0);
  require(call, "key_cache", a.key_cache, blocks > 0);
  require(call, "value_cache", a.value_cache, blocks > 0);
  require(call, "block_tables", a.block_tables, any_seqs && columns > 0);
  require(call, "seq_lens", a.seq_lens, any_seqs);
  kpa::AttentionParams params;
  params.scale = o.scale;
  params.k_scale = o.k_scale;
  params.v_scale = o.v_scale;
  params.tp_rank = o.tp_rank;
  params.logits_soft_cap = o.logits_soft_cap;
  params.sliding_window = o.sliding_window;
  params.check_indices = o.check_indices != 0;
  if (o.block_sparse != nullptr) {
    params.block_sparse = kpa::BlockSparse{o.block_sparse->local_blocks, o.block_sparse->vert_stride,
                                           o.block_sparse->block_size, o.block_sparse->head_sliding_step};
  }
  with_types(call, a.dtype, a.cache_dtype, [&](auto t, auto c, kpa::KVCacheDType kv) {
    using T = typename decltype(t)::type;
    using C = typename decltype(c)::type;
    params.kv_cache_dtype = kv;
    const int x = static_cast<int>(16 / sizeof(C));
    Unmanaged<Space, T***> out_view(static_cast<T*>(out), rows, heads, head_size);
    Unmanaged<Space, const T***> query(static_cast<const T*>(a.query), rows, heads, head_size);
    Unmanaged<Space, const C*****> key_cache(static_cast<const C*>(a.key_cache), blocks, kv_heads, head_size / x,
                                             block_size, x);
    Unmanaged<Space, const C****> value_cache(static_cast<const C*>(a.value_cache), blocks, kv_heads, head_size,
                                              block_size);
    Unmanaged<Space, const int**> block_tables(a.block_tables, seqs, columns);
    Unmanaged<Space, const int*> seq_lens(a.seq_lens, seqs);
    Unmanaged<Space, const float*> alibi(o.alibi_slopes, o.alibi_slopes != nullptr ? heads : 0);
    call_kpa(t, out_view, query, key_cache, value_cache, block_tables, seq_lens, max_seq_len, alibi, params);
  });
}

}  // namespace

extern "C" {

int kpa_init(void) {
  last_error.clear();
  const std::lock_guard<std::mutex> lock(lifetime_mutex);
  if (owner.load() != Owner::None) return KPA_OK;
  if (Kokkos::is_initialized()) {  // the host program's Kokkos, used from its threads
    owner = Owner::Host;
    // A host program that finalises Kokkos itself must not leave kpa's workspaces and stream
    // instances behind.
    Kokkos::push_finalize_hook([] {
      release_kokkos_resources();
      owner = Owner::None;
    });
    return KPA_OK;
  }
  Outcome started;
  try {
    started = kokkos_thread.start([] {
      try {
        Kokkos::initialize();
        return Outcome{};
      } catch (const std::exception& e) {
        return Outcome{KPA_ERR_RUNTIME, e.what()};
      }
    });
  } catch (const std::exception& e) {  // no thread could be started
    started = Outcome{KPA_ERR_RUNTIME, e.what()};
  }
  if (started.status != KPA_OK) {
    last_error = "kpa_init: " + started.message;
    return started.status;
  }
  owner = Owner::Kpa;
  return KPA_OK;
}

void kpa_finalize(void) {
  const std::lock_guard<std::mutex> lock(lifetime_mutex);
  if (owner.load() == Owner::Kpa) {
    kokkos_thread.stop([] {
      release_kokkos_resources();
      Kokkos::finalize();
      return Outcome{};
    });
  } else {
    release_kokkos_resources();
  }
  owner = Owner::None;
}

const char* kpa_last_error(void) { return last_error.c_str(); }

const char* kpa_version(void) { return kpa::version_string; }

const char* kpa_host_isa(void) {
  try {
    return kpa::to_string(kpa::detail::chosen_host_isa(kpa::detail::best_host_isa())).data();
  } catch (const kpa::Error& e) {  // a KPA_HOST_ISA this CPU cannot run
    last_error = e.what();
    return "";
  }
}

int kpa_set_check_indices(int enabled) { return check_indices.exchange(enabled != 0) ? 1 : 0; }

int kpa_check_indices(void) { return check_indices.load() ? 1 : 0; }

int kpa_set_execution(kpa_memory memory, void* stream) {
  const int where = enum_value(memory);
  if (where != KPA_MEMORY_DEFAULT && where != KPA_MEMORY_HOST) {
    last_error = "kpa_set_execution: memory = " + std::to_string(where) + " is not a kpa_memory";
    return KPA_ERR_INVALID_ARGUMENT;
  }
  constexpr bool streams = !Kokkos::SpaceAccessibility<DefaultSpace, Kokkos::HostSpace>::accessible;
  if (stream != nullptr && (!streams || (kSeparateHostSpace && where == KPA_MEMORY_HOST))) {
    last_error = streams ? "kpa_set_execution: a stream is for KPA_MEMORY_DEFAULT (the GPU); host calls take none"
                         : "kpa_set_execution: this libkpa was built for host back ends only and takes no stream";
    return KPA_ERR_UNSUPPORTED;
  }
  execution = Execution{where, stream};
  last_error.clear();
  return KPA_OK;
}

int kpa_paged_attention_v1(void* out, const void* query, kpa_dtype dtype, const void* key_cache,
                           const void* value_cache, kpa_dtype cache_dtype, int64_t num_seqs, int64_t num_heads,
                           int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
                           const int32_t* block_tables, int64_t max_blocks_per_seq, const int32_t* seq_lens,
                           int64_t max_seq_len, float scale, const float* alibi_slopes, float k_scale, float v_scale,
                           int tp_rank, const kpa_block_sparse* block_sparse) {
  return guarded([&](const auto& space) {
    const CAttentionArgs args(query, dtype, key_cache, value_cache, cache_dtype, num_seqs, num_heads, num_kv_heads,
                              head_size, num_blocks, block_size, block_tables, max_blocks_per_seq, seq_lens, max_seq_len,
                              attention_options(scale, alibi_slopes, k_scale, v_scale, tp_rank, block_sparse));
    with_attention_views("kpa_paged_attention_v1", space, out, args, [&](auto, auto&&... views) {
      kpa::paged_attention_v1(space, views...);
    });
  });
}

int kpa_paged_attention_v2(void* out, float* exp_sums, float* max_logits, void* tmp_out, int64_t max_num_partitions,
                           int64_t partition_size, const void* query, kpa_dtype dtype, const void* key_cache,
                           const void* value_cache, kpa_dtype cache_dtype, int64_t num_seqs, int64_t num_heads,
                           int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
                           const int32_t* block_tables, int64_t max_blocks_per_seq, const int32_t* seq_lens,
                           int64_t max_seq_len, float scale, const float* alibi_slopes, float k_scale, float v_scale,
                           int tp_rank, const kpa_block_sparse* block_sparse) {
  constexpr const char* call = "kpa_paged_attention_v2";
  return guarded([&](const auto& space) {
    using Space = std::decay_t<decltype(space)>;
    const int partitions = to_int(call, "max_num_partitions", max_num_partitions);
    const int partition = to_int(call, "partition_size", partition_size, false);
    const bool any = num_seqs > 0 && partitions > 0;
    require(call, "exp_sums", exp_sums, any);
    require(call, "max_logits", max_logits, any);
    require(call, "tmp_out", tmp_out, any);
    const CAttentionArgs args(query, dtype, key_cache, value_cache, cache_dtype, num_seqs, num_heads, num_kv_heads,
                              head_size, num_blocks, block_size, block_tables, max_blocks_per_seq, seq_lens, max_seq_len,
                              attention_options(scale, alibi_slopes, k_scale, v_scale, tp_rank, block_sparse));
    with_attention_views(call, space, out, args, [&](auto t, const auto& out_view, const auto& query_view,
                                                     const auto& kc, const auto& vc, const auto& bt, const auto& sl,
                                                     int max_len, const auto& alibi, const kpa::AttentionParams& params) {
      using T = typename decltype(t)::type;
      const auto seqs = out_view.extent(0), heads = out_view.extent(1), size = out_view.extent(2);
      Unmanaged<Space, float***> sums(exp_sums, seqs, heads, partitions), maxes(max_logits, seqs, heads, partitions);
      Unmanaged<Space, T****> tmp(static_cast<T*>(tmp_out), seqs, heads, partitions, size);
      kpa::paged_attention_v2(space, out_view, sums, maxes, tmp, query_view, kc, vc, bt, sl, max_len, alibi, params,
                              partition);
    });
  });
}

int kpa_paged_attention(void* out, const void* query, kpa_dtype dtype, const void* key_cache, const void* value_cache,
                        kpa_dtype cache_dtype, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                        int64_t head_size, int64_t num_blocks, int64_t block_size, const int32_t* block_tables,
                        int64_t max_blocks_per_seq, const int32_t* seq_lens, int64_t max_seq_len, float scale,
                        const float* alibi_slopes, float k_scale, float v_scale, int tp_rank,
                        const kpa_block_sparse* block_sparse) {
  return guarded([&](const auto& space) {
    const std::lock_guard<std::mutex> lock(workspace_mutex);
    const CAttentionArgs args(query, dtype, key_cache, value_cache, cache_dtype, num_seqs, num_heads, num_kv_heads,
                              head_size, num_blocks, block_size, block_tables, max_blocks_per_seq, seq_lens, max_seq_len,
                              attention_options(scale, alibi_slopes, k_scale, v_scale, tp_rank, block_sparse));
    with_attention_views("kpa_paged_attention", space, out, args, [&](auto, auto&&... views) {
      kpa::paged_attention(space, workspace_for(space), views...);
    });
  });
}

void kpa_attention_options_init(kpa_attention_options* options) {
  if (options == nullptr) return;
  *options = kpa_attention_options{};
  options->struct_size = sizeof(kpa_attention_options);
  options->scale = options->k_scale = options->v_scale = 1.0f;
  options->num_tokens = -1;
  options->check_indices = 1;
}

int kpa_paged_attention_ex(void* out, const void* query, kpa_dtype dtype, const void* key_cache,
                           const void* value_cache, kpa_dtype cache_dtype, int64_t num_seqs, int64_t num_heads,
                           int64_t num_kv_heads, int64_t head_size, int64_t num_blocks, int64_t block_size,
                           const int32_t* block_tables, int64_t max_blocks_per_seq, const int32_t* seq_lens,
                           int64_t max_seq_len, const kpa_attention_options* options) {
  constexpr const char* call = "kpa_paged_attention_ex";
  return guarded([&](const auto& space) {
    using Space = std::decay_t<decltype(space)>;
    kpa_attention_options defaults;
    kpa_attention_options_init(&defaults);
    if (options != nullptr && options->struct_size != sizeof(kpa_attention_options)) {
      invalid(call, "options->struct_size = " + std::to_string(options->struct_size) + " is not sizeof(kpa_attention_options) = " +
                        std::to_string(sizeof(kpa_attention_options)) + " (call kpa_attention_options_init first)");
    }
    const kpa_attention_options& o = options != nullptr ? *options : defaults;
    const bool several = o.query_start_loc != nullptr;
    if (!several && o.num_tokens >= 0 && o.num_tokens != num_seqs) {
      invalid(call, "num_tokens = " + std::to_string(o.num_tokens) + " differs from num_seqs = " + std::to_string(num_seqs) +
                        " without query_start_loc");
    }
    if (several && o.num_tokens < 0) invalid(call, "num_tokens must be given with query_start_loc");
    const int seqs = to_int(call, "num_seqs", num_seqs);
    const int heads = to_int(call, "num_heads", num_heads, false);
    const int rows = several ? to_int(call, "num_tokens", o.num_tokens) : seqs;
    const CAttentionArgs args(query, dtype, key_cache, value_cache, cache_dtype, num_seqs, num_heads, num_kv_heads,
                              head_size, num_blocks, block_size, block_tables, max_blocks_per_seq, seq_lens, max_seq_len,
                              o);
    const std::lock_guard<std::mutex> lock(workspace_mutex);
    with_attention_views(call, space, out, args, [&](auto, const auto& out_view, const auto& query_view,
                                                     const auto& kc, const auto& vc, const auto& bt, const auto& sl,
                                                     int max_len, const auto& alibi, const kpa::AttentionParams& params) {
      kpa::AttentionExtras<Space> extras;
      if (several) extras.query_start_loc = Unmanaged<Space, const int*>(o.query_start_loc, seqs + 1);
      if (o.sinks != nullptr) extras.sinks = Unmanaged<Space, const float*>(o.sinks, heads);
      if (o.lse != nullptr) extras.lse = Unmanaged<Space, float**>(o.lse, rows, heads);
      kpa::paged_attention(space, workspace_for(space), out_view, query_view, kc, vc, bt, sl, max_len, alibi, params, extras);
    });
  });
}

int kpa_merge_attn_states(void* out, float* out_lse, const void* prefix_out, const float* prefix_lse,
                          const void* suffix_out, const float* suffix_lse, kpa_dtype dtype, int64_t num_tokens,
                          int64_t num_heads, int64_t head_size) {
  constexpr const char* call = "kpa_merge_attn_states";
  return guarded([&](const auto& space) {
    using Space = std::decay_t<decltype(space)>;
    const int tokens = to_int(call, "num_tokens", num_tokens);
    const int heads = to_int(call, "num_heads", num_heads, false);
    const int size = to_int(call, "head_size", head_size, false);
    const bool any = tokens > 0;
    require(call, "out", out, any);
    require(call, "prefix_out", prefix_out, any);
    require(call, "prefix_lse", prefix_lse, any);
    require(call, "suffix_out", suffix_out, any);
    require(call, "suffix_lse", suffix_lse, any);
    auto merge = [&](auto t) {
      using T = typename decltype(t)::type;
      Unmanaged<Space, float**> lse(out_lse, out_lse != nullptr ? tokens : 0, heads);
      kpa::merge_attn_states(space, Unmanaged<Space, T***>(static_cast<T*>(out), tokens, heads, size), lse,
                             Unmanaged<Space, const T***>(static_cast<const T*>(prefix_out), tokens, heads, size),
                             Unmanaged<Space, const float**>(prefix_lse, tokens, heads),
                             Unmanaged<Space, const T***>(static_cast<const T*>(suffix_out), tokens, heads, size),
                             Unmanaged<Space, const float**>(suffix_lse, tokens, heads));
    };
    switch (dtype_value(dtype)) {
      case KPA_F32: merge(Tag<float>{}); break;
      case KPA_F16: merge(Tag<kpa::half>{}); break;
      case KPA_BF16: merge(Tag<kpa::bfloat16>{}); break;
      default: invalid(call, "dtype " + std::to_string(dtype_value(dtype)) + " is not F32, F16 or BF16", KPA_ERR_UNSUPPORTED);
    }
  });
}

int kpa_reshape_and_cache(const void* key, const void* value, kpa_dtype dtype, void* key_cache, void* value_cache,
                          kpa_dtype cache_dtype, int64_t num_tokens, int64_t num_kv_heads, int64_t head_size,
                          int64_t num_blocks, int64_t block_size, const int64_t* slot_mapping, float k_scale,
                          float v_scale) {
  constexpr const char* call = "kpa_reshape_and_cache";
  return guarded([&](const auto& space) {
    using Space = std::decay_t<decltype(space)>;
    const int tokens = to_int(call, "num_tokens", num_tokens);
    const int kv_heads = to_int(call, "num_kv_heads", num_kv_heads, false);
    const int size = to_int(call, "head_size", head_size, false);
    const int blocks = to_int(call, "num_blocks", num_blocks);
    const int bs = to_int(call, "block_size", block_size, false);
    require(call, "key", key, tokens > 0);
    require(call, "value", value, tokens > 0);
    require(call, "slot_mapping", slot_mapping, tokens > 0);
    require(call, "key_cache", key_cache, blocks > 0);
    require(call, "value_cache", value_cache, blocks > 0);
    with_types(call, dtype_value(dtype), dtype_value(cache_dtype), [&](auto t, auto c, kpa::KVCacheDType kv) {
      using T = typename decltype(t)::type;
      using C = typename decltype(c)::type;
      const int x = static_cast<int>(16 / sizeof(C));
      Unmanaged<Space, const T***> k(static_cast<const T*>(key), tokens, kv_heads, size);
      Unmanaged<Space, const T***> v(static_cast<const T*>(value), tokens, kv_heads, size);
      Unmanaged<Space, C*****> kc(static_cast<C*>(key_cache), blocks, kv_heads, size / x, bs, x);
      Unmanaged<Space, C****> vc(static_cast<C*>(value_cache), blocks, kv_heads, size, bs);
      Unmanaged<Space, const std::int64_t*> slots(reinterpret_cast<const std::int64_t*>(slot_mapping), tokens);
      kpa::reshape_and_cache(space, k, v, kc, vc, slots, kv, k_scale, v_scale, check_indices.load());
    });
  });
}

int kpa_copy_blocks(void* const* key_caches, void* const* value_caches, int64_t num_layers, kpa_dtype cache_dtype,
                    int64_t num_blocks, int64_t block_elems, const int64_t* block_mapping, int64_t num_pairs) {
  constexpr const char* call = "kpa_copy_blocks";
  return guarded([&](const auto& space) {
    using Space = std::decay_t<decltype(space)>;
    const int layers = to_int(call, "num_layers", num_layers);
    const int blocks = to_int(call, "num_blocks", num_blocks);
    if (block_elems < 1) invalid(call, "block_elems = " + std::to_string(block_elems) + " is not positive");
    const int pairs = to_int(call, "num_pairs", num_pairs);
    const std::int64_t bytes = element_bytes(call, dtype_value(cache_dtype));
    require(call, "key_caches", key_caches, layers > 0);
    require(call, "value_caches", value_caches, layers > 0);
    require(call, "block_mapping", block_mapping, pairs > 0);
    // A block is copied bit for bit: as unsigned words of the element's size, never as floats.
    auto copy = [&](auto word) {
      using W = typename decltype(word)::type;
      std::vector<Unmanaged<Space, W**>> keys, values;
      for (int layer = 0; layer < layers; ++layer) {
        require(call, ("key_caches[" + std::to_string(layer) + "]").c_str(), key_caches[layer], blocks > 0);
        require(call, ("value_caches[" + std::to_string(layer) + "]").c_str(), value_caches[layer], blocks > 0);
        keys.emplace_back(static_cast<W*>(key_caches[layer]), blocks, block_elems);
        values.emplace_back(static_cast<W*>(value_caches[layer]), blocks, block_elems);
      }
      kpa::copy_blocks(space, keys, values, Unmanaged<Space, const std::int64_t**>(block_mapping, pairs, 2),
                       check_indices.load());
    };
    switch (bytes) {
      case 4: copy(Tag<std::uint32_t>{}); break;
      case 2: copy(Tag<std::uint16_t>{}); break;
      default: copy(Tag<std::uint8_t>{}); break;
    }
  });
}

int kpa_swap_blocks(const void* src_cache, kpa_memory src_memory, int64_t src_num_blocks, void* dst_cache,
                    kpa_memory dst_memory, int64_t dst_num_blocks, int64_t block_bytes, const int64_t* block_mapping,
                    int64_t num_pairs) {
  constexpr const char* call = "kpa_swap_blocks";
  return guarded([&](const auto& space) {
    using Space = std::decay_t<decltype(space)>;
    const int src_blocks = to_int(call, "src_num_blocks", src_num_blocks);
    const int dst_blocks = to_int(call, "dst_num_blocks", dst_num_blocks);
    if (block_bytes < 1) invalid(call, "block_bytes = " + std::to_string(block_bytes) + " is not positive");
    const int pairs = to_int(call, "num_pairs", num_pairs);
    require(call, "src_cache", src_cache, src_blocks > 0);
    require(call, "dst_cache", dst_cache, dst_blocks > 0);
    require(call, "block_mapping", block_mapping, pairs > 0);
    using Byte = std::uint8_t;
    with_memory(call, "src_memory", src_memory, [&](auto src_space) {
      with_memory(call, "dst_memory", dst_memory, [&](auto dst_space) {
        using Traits = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
        using Src = Kokkos::View<const Byte**, Kokkos::LayoutRight, typename decltype(src_space)::type, Traits>;
        using Dst = Kokkos::View<Byte**, Kokkos::LayoutRight, typename decltype(dst_space)::type, Traits>;
        using HostMapping = Kokkos::View<const std::int64_t**, Kokkos::LayoutRight, Kokkos::HostSpace, Traits>;
        kpa::swap_blocks(space, Src(static_cast<const Byte*>(src_cache), src_blocks, block_bytes),
                         Dst(static_cast<Byte*>(dst_cache), dst_blocks, block_bytes),
                         HostMapping(block_mapping, pairs, 2));
      });
    });
  });
}

}  // extern "C"
