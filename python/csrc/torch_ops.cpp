// torch.ops.kpa.*: vLLM's paged-attention and cache operators, with vLLM's schemas, over kpa's C
// ABI (libkpa.so). Each operator checks its tensors against the shapes the C ABI will assume (the
// C ABI sees pointers only), brings queries, keys and tables into the layouts it takes, and turns
// kpa's status codes into Python exceptions: ValueError for bad arguments, NotImplementedError
// for what kpa does not support, RuntimeError otherwise.
//
// The extension loads its libkpa at run time from the package's folder rather than linking it,
// so that a CUDA build can hold two: CPU tensors run on a host libkpa (OpenMP), CUDA tensors on
// the CUDA build of libkpa (KPA_TORCH_CUDA), on torch's current stream, without waiting for the
// GPU unless an index check or an fp8 scale held on the GPU needs a value back. Each library
// starts when the first tensor of its kind arrives, so CPU tensors run on a machine without a
// GPU or its driver. The CUDA build's host libkpa carries its own Kokkos and exports the C ABI
// only (KPA_SELF_CONTAINED), so the two Kokkos never meet. The same checks run for meta tensors
// (torch's fake tensors: shape propagation under tracing and torch.compile) without touching data.

#include <kpa/kpa.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#ifdef KPA_TORCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <dlfcn.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

/// vLLM's PARTITION_SIZE: paged_attention_v2 splits every sequence into partitions of 512 tokens.
constexpr int64_t kPartitionSize = 512;

// The C ABI functions the operators call, each a member of KpaLibrary.
#define KPA_TORCH_C_ABI(X)                                                                                        \
  X(init) X(last_error) X(version) X(host_isa) X(set_check_indices) X(set_execution) X(paged_attention_v1)     \
  X(paged_attention_v2) X(paged_attention_ex) X(attention_options_init) X(reshape_and_cache) X(copy_blocks)    \
  X(swap_blocks)

/// One libkpa's C ABI, resolved from the library file.
struct KpaLibrary {
#define KPA_TORCH_MEMBER(name) decltype(&kpa_##name) name = nullptr;
  KPA_TORCH_C_ABI(KPA_TORCH_MEMBER)
#undef KPA_TORCH_MEMBER

  /// Raises the exception matching a kpa_status, with this library's message.
  void check(int status) const {
    if (status == KPA_OK) return;
    const std::string message = last_error();
    TORCH_CHECK_VALUE(status != KPA_ERR_INVALID_ARGUMENT, message);
    TORCH_CHECK_NOT_IMPLEMENTED(status != KPA_ERR_UNSUPPORTED, message);
    TORCH_CHECK(false, message);
  }
};

/// The folder this extension was loaded from, which holds its libraries.
std::string package_folder() {
  Dl_info info{};
  TORCH_CHECK(dladdr(reinterpret_cast<void*>(&package_folder), &info) != 0 && info.dli_fname != nullptr,
              "kpa: cannot tell where the extension was loaded from");
  const std::string path = info.dli_fname;
  return path.substr(0, path.rfind('/') + 1);
}

/// Whether the operators check the indices they follow (kpa.set_check_indices): held here and
/// given to every library as it starts, so that the host and CUDA libraries agree.
std::atomic<bool> check_indices_setting{true};
std::mutex libraries_mutex;  // library start-up and set_check_indices

/// A libkpa of the package (file: its path relative to the package's folder), loaded and
/// initialised once, when first asked for.
class LibraryHolder {
 public:
  LibraryHolder(const char* file, const char* what) : file_(file), what_(what) {}

  /// The library's C ABI, loaded but not initialised (kpa_version needs no Kokkos); null if it
  /// cannot be loaded (error() says why).
  const KpaLibrary* loaded() {
    std::call_once(load_once_, [this] { load(); });
    return error_.empty() ? &library_ : nullptr;
  }

  /// The library, initialised (`before_init` runs just before kpa_init); null if it cannot start.
  template <class BeforeInit>
  const KpaLibrary* started(BeforeInit&& before_init) {
    const KpaLibrary* library = loaded();
    if (library == nullptr) return nullptr;
    std::call_once(start_once_, [&] {
      before_init();
      const std::lock_guard<std::mutex> lock(libraries_mutex);
      if (library->init() != KPA_OK) {
        error_ = std::string("kpa: ") + what_ + " could not start: " + library->last_error();
        return;
      }
      library->set_check_indices(check_indices_setting.load() ? 1 : 0);
      started_ = true;
    });
    return started_ ? library : nullptr;
  }

  /// Why loaded() or started() gave null.
  const std::string& error() const { return error_; }

  /// The library if it has started (else null), for settings that every started library takes.
  const KpaLibrary* if_started() const { return started_ ? &library_ : nullptr; }

 private:
  void load() {
    const std::string path = package_folder() + file_;
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      error_ = std::string("kpa: ") + what_ + " could not start: " + dlerror();
      return;
    }
#define KPA_TORCH_RESOLVE(name)                                                                            \
  library_.name = reinterpret_cast<decltype(&kpa_##name)>(dlsym(handle, "kpa_" #name));                   \
  if (library_.name == nullptr) {                                                                          \
    error_ = std::string("kpa: ") + path + " has no kpa_" #name " (a libkpa of another version?)";         \
    return;                                                                                                \
  }
    KPA_TORCH_C_ABI(KPA_TORCH_RESOLVE)
#undef KPA_TORCH_RESOLVE
  }

  const char* file_;
  const char* what_;
  std::once_flag load_once_, start_once_;
  KpaLibrary library_;
  std::string error_;
  std::atomic<bool> started_{false};
};

/// The libkpa CPU tensors run on (setup.py puts the libraries in place).
#ifdef KPA_TORCH_CUDA
LibraryHolder host_library("host/libkpa.so", "kpa's host library");
#else
LibraryHolder host_library("libkpa.so", "kpa's host library");
#endif

const KpaLibrary& host_kpa() {
  const KpaLibrary* library = host_library.started([] {});
  TORCH_CHECK(library != nullptr, host_library.error());
  return *library;
}

#ifdef KPA_TORCH_CUDA
/// The CUDA build of libkpa, for CUDA tensors.
LibraryHolder cuda_library("libkpa.so", "kpa's CUDA back end");

/// The GPU kpa runs on: Kokkos (3.4 and later) drives one device per process, chosen when kpa
/// initialises it. Unless KOKKOS_DEVICE_ID says otherwise, that is torch's current device then.
int kpa_gpu = -1;

const KpaLibrary& cuda_kpa() {
  const KpaLibrary* library = cuda_library.started([] {
    if (const char* chosen = std::getenv("KOKKOS_DEVICE_ID")) {
      kpa_gpu = std::atoi(chosen);
    } else if (at::cuda::is_available()) {
      kpa_gpu = at::cuda::current_device();
      setenv("KOKKOS_DEVICE_ID", std::to_string(kpa_gpu).c_str(), 0);
    }
  });
  if (library == nullptr) {
    const std::string& why = cuda_library.error();
    // The library (through Kokkos) needs the driver's libcuda.so.1 to load at all.
    const bool no_driver = why.find("libcuda.so") != std::string::npos;
    TORCH_CHECK(false, why, no_driver ? " (the NVIDIA driver is not installed on this machine)" : "",
                "; CPU tensors still run on kpa's host back end");
  }
  return *library;
}
#endif

/// Whether kpa checks indices before launching (kpa.set_check_indices).
bool indices_checked() { return check_indices_setting.load(); }

std::string shape_of(const at::Tensor& t) { return c10::str(t.sizes()); }

void expect_shape(const char* op, const char* name, const at::Tensor& t, at::IntArrayRef shape) {
  TORCH_CHECK_VALUE(t.sizes() == shape, op, ": ", name, " has shape ", shape_of(t), ", expected ", shape);
}

void expect_dtype(const char* op, const char* name, const at::Tensor& t, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, op, ": ", name, " is ", t.scalar_type(), ", expected ", dtype);
}

void expect_contiguous(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name, " must be contiguous (strides ", t.strides(), ")");
}

void expect_same_device(const char* op, const char* name, const at::Tensor& t, const char* first_name,
                        const at::Tensor& first) {
  TORCH_CHECK_VALUE(t.device() == first.device(), op, ": ", name, " is on ", t.device(), ", ", first_name, " on ",
                    first.device());
}

using Named = std::pair<const char*, const at::Tensor*>;

/// Every tensor of an operator on the device of the first.
void expect_one_device(const char* op, std::initializer_list<Named> tensors) {
  const Named& first = *tensors.begin();
  for (const Named& t : tensors) expect_same_device(op, t.first, *t.second, first.first, *first.second);
}

kpa_dtype activation_dtype(const char* op, const char* name, const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return KPA_F32;
    case at::kHalf: return KPA_F16;
    case at::kBFloat16: return KPA_BF16;
    default: TORCH_CHECK_NOT_IMPLEMENTED(false, op, ": ", name, " is ", t.scalar_type(), "; kpa takes float32, float16, bfloat16");
  }
}

/// kv_cache_dtype as vLLM spells it, against the dtype of the cache tensors.
kpa_dtype cache_dtype_of(const char* op, const std::string& kv_cache_dtype, const at::Tensor& cache, kpa_dtype dtype,
                         const at::Tensor& activations) {
  if (kv_cache_dtype == "auto") {
    TORCH_CHECK_NOT_IMPLEMENTED(cache.scalar_type() == activations.scalar_type(), op,
                                ": with kv_cache_dtype \"auto\" the caches hold the activations' dtype ",
                                activations.scalar_type(), ", not ", cache.scalar_type());
    return dtype;
  }
  const bool e4m3 = kv_cache_dtype == "fp8" || kv_cache_dtype == "fp8_e4m3";
  TORCH_CHECK_NOT_IMPLEMENTED(e4m3 || kv_cache_dtype == "fp8_e5m2", op, ": kv_cache_dtype \"", kv_cache_dtype,
                              "\" is not supported (kpa takes \"auto\", \"fp8\", \"fp8_e4m3\", \"fp8_e5m2\")");
  TORCH_CHECK_VALUE(cache.scalar_type() == at::kByte, op, ": an fp8 cache is a uint8 tensor, not ", cache.scalar_type());
  return e4m3 ? KPA_FP8_E4M3 : KPA_FP8_E5M2;
}

int64_t element_bytes(kpa_dtype dtype) { return dtype == KPA_F32 ? 4 : dtype == KPA_F16 || dtype == KPA_BF16 ? 2 : 1; }

/// A 0-d or one-element float scale (vLLM passes k_scale / v_scale as tensors).
void expect_scale(const char* op, const char* name, const at::Tensor& scale) {
  TORCH_CHECK_VALUE(scale.sym_numel() == 1 && at::isFloatingType(scale.scalar_type()), op, ": ", name,
                    " must hold one floating-point value (shape ", shape_of(scale), ", ", scale.scalar_type(), ")");
}



void expect_index_type(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": ", name,
                    " must be int32 or int64, not ", t.scalar_type());
}

/// An int32 or int64 index tensor as a contiguous int32 one (the C ABI's), refusing values that
/// int32 cannot hold rather than wrapping them when indices are checked (the check reads the
/// extremes back on the host).
at::Tensor as_int32(const char* op, const char* name, const at::Tensor& t) {
  if (t.scalar_type() == at::kLong && t.numel() > 0 && indices_checked()) {
    const int64_t lo = t.min().item<int64_t>(), hi = t.max().item<int64_t>();
    TORCH_CHECK_VALUE(lo >= INT32_MIN && hi <= INT32_MAX, op, ": ", name, " holds ", lo < INT32_MIN ? lo : hi,
                      ", outside int32");
  }
  return t.to(at::kInt).contiguous();
}

/// Where an operator's tensors live, which says what runs it.
enum class Where {
  Meta,  ///< meta (fake) tensors: the checks are the whole operator
  Host,  ///< CPU tensors: kpa's host back end
  Gpu,   ///< CUDA tensors: kpa's CUDA back end on torch's current stream
};

#ifdef KPA_TORCH_CUDA
constexpr const char* kTensorKinds = "CPU and CUDA";
#else
constexpr const char* kTensorKinds = "CPU";
#endif

Where where_of(const char* op, const at::Tensor& t) {
  if (t.is_meta()) return Where::Meta;
  if (t.device().is_cpu()) return Where::Host;
#ifdef KPA_TORCH_CUDA
  if (t.device().is_cuda()) return Where::Gpu;
#else
  TORCH_CHECK_NOT_IMPLEMENTED(!t.device().is_cuda(), op,
                              ": this kpa was built for CPU tensors only (a host build of libkpa); CUDA tensors need "
                              "kpa built with its CUDA back end (see the README)");
#endif
  C10_THROW_ERROR(NotImplementedError, c10::str(op, ": kpa takes ", kTensorKinds, " tensors, not ", t.device().type(), " ones"));
}

/// Where this thread's kpa calls go: the host library, or the CUDA one on a GPU stream, and
/// whether a CUDA graph is capturing that stream.
struct Launch {
  const KpaLibrary* kpa = nullptr;
  void* stream = nullptr;
  bool capturing = false;
};

/// The library for `where`, this thread's calls pointed at its back end: the host, or the GPU of
/// `t` on torch's current stream there.
Launch run_on(const char* op, Where where, const at::Tensor& t) {
  if (where == Where::Host) {
    const KpaLibrary& host = host_kpa();
    host.check(host.set_execution(KPA_MEMORY_HOST, nullptr));
    return Launch{&host};
  }
#ifdef KPA_TORCH_CUDA
  const KpaLibrary& gpu = cuda_kpa();
  TORCH_CHECK_NOT_IMPLEMENTED(t.device().index() == kpa_gpu, op, ": kpa runs on one GPU per process, cuda:", kpa_gpu,
                              " (torch's device when kpa started, or KOKKOS_DEVICE_ID); this tensor is on ",
                              t.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(t.device().index()).stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TORCH_CHECK(cudaStreamIsCapturing(stream, &status) == cudaSuccess, op, ": cudaStreamIsCapturing failed");
  const Launch launch{&gpu, stream, status != cudaStreamCaptureStatusNone};
  TORCH_CHECK(!(launch.capturing && indices_checked()), op,
              ": the index check waits for the GPU, which a CUDA graph capture forbids; call "
              "kpa.set_check_indices(False) before capturing");
  gpu.check(gpu.set_execution(KPA_MEMORY_DEFAULT, launch.stream));
  return launch;
#else
  (void)t;
  C10_THROW_ERROR(NotImplementedError, c10::str(op, ": this kpa was built for CPU tensors only"));
#endif
}

/// A scale's value, read on the host (a scale on the GPU is copied back: a wait for the stream).
float scale_value(const char* op, const at::Tensor& scale, const Launch& launch) {
  // item() goes through the dispatcher; a CPU float32 scale is read in place.
  if (scale.device().is_cpu() && scale.scalar_type() == at::kFloat) return *scale.data_ptr<float>();
  TORCH_CHECK(!(launch.capturing && !scale.device().is_cpu()), op,
              ": an fp8 scale on the GPU is read on the host, which a CUDA graph capture forbids; pass k_scale and "
              "v_scale as floats or CPU tensors");
  return scale.item<float>();
}

/// A scale lives on the CPU or with the operator's data.
void expect_scale_device(const char* op, const char* name, const at::Tensor& scale, const at::Tensor& data) {
  TORCH_CHECK_VALUE(scale.device().is_cpu() || scale.device() == data.device(), op, ": ", name, " is on ",
                    scale.device(), ", the data on ", data.device(), " (a scale may also be a CPU tensor)");
}

/// Everything paged_attention_v1 and v2 share, checked; `cpu` adds the converted inputs.
struct Attention {
  kpa_dtype dtype, cache_dtype;
  int64_t num_tokens;  ///< query rows: num_seqs, or query_start_loc's last entry
  int64_t num_seqs, num_heads, num_kv_heads, head_size, num_blocks, block_size, max_blocks_per_seq, max_seq_len;
  bool has_alibi;
  int tp_rank;
  kpa_block_sparse sparse{};
  bool is_sparse;
  // Filled by prepare() for CPU and CUDA tensors:
  at::Tensor query, block_tables, seq_lens, alibi, query_start_loc;
  float k_scale = 1.0f, v_scale = 1.0f;
};

/// An attention operator's arguments, named as the schemas name them: vLLM's v1 and v2 have all
/// but query_start_loc; kpa's paged_attention has no tp_rank and no block-sparse pattern.
struct AttentionArgs {
  at::Tensor out, query, key_cache, value_cache;
  int64_t num_kv_heads;
  at::Tensor block_tables, seq_lens;
  int64_t block_size, max_seq_len;
  c10::optional<at::Tensor> alibi_slopes;
  std::string kv_cache_dtype;
  at::Tensor k_scale, v_scale;
  int64_t tp_rank = 0;
  int64_t blocksparse_local_blocks = 0, blocksparse_vert_stride = 0, blocksparse_block_size = 64,
          blocksparse_head_sliding_step = 0;
  c10::optional<at::Tensor> query_start_loc;

  /// The arguments every attention schema has, in the schemas' order.
  AttentionArgs(const at::Tensor& out_, const at::Tensor& query_, const at::Tensor& key_cache_,
                const at::Tensor& value_cache_, int64_t num_kv_heads_, const at::Tensor& block_tables_,
                const at::Tensor& seq_lens_, int64_t block_size_, int64_t max_seq_len_,
                const c10::optional<at::Tensor>& alibi_slopes_, const std::string& kv_cache_dtype_,
                const at::Tensor& k_scale_, const at::Tensor& v_scale_)
      : out(out_), query(query_), key_cache(key_cache_), value_cache(value_cache_), num_kv_heads(num_kv_heads_),
        block_tables(block_tables_), seq_lens(seq_lens_), block_size(block_size_), max_seq_len(max_seq_len_),
        alibi_slopes(alibi_slopes_), kv_cache_dtype(kv_cache_dtype_), k_scale(k_scale_), v_scale(v_scale_) {}

  /// vLLM's v1 and v2 add the tensor-parallel rank and the block-sparse pattern.
  AttentionArgs& with_block_sparse(int64_t rank, int64_t local_blocks, int64_t vert_stride, int64_t sparse_block_size,
                                   int64_t head_sliding_step) {
    tp_rank = rank;
    blocksparse_local_blocks = local_blocks;
    blocksparse_vert_stride = vert_stride;
    blocksparse_block_size = sparse_block_size;
    blocksparse_head_sliding_step = head_sliding_step;
    return *this;
  }
};

Attention check_attention(const char* op, const AttentionArgs& args) {
  const at::Tensor &out = args.out, &query = args.query, &key_cache = args.key_cache, &value_cache = args.value_cache;
  const at::Tensor &block_tables = args.block_tables, &seq_lens = args.seq_lens;
  const at::Tensor &k_scale = args.k_scale, &v_scale = args.v_scale;
  const c10::optional<at::Tensor>& alibi_slopes = args.alibi_slopes;
  const c10::optional<at::Tensor>& query_start_loc = args.query_start_loc;
  const int64_t num_kv_heads = args.num_kv_heads, block_size = args.block_size, tp_rank = args.tp_rank;
  const std::string& kv_cache_dtype = args.kv_cache_dtype;
  Attention a{};
  TORCH_CHECK_VALUE(query.dim() == 3, op, ": query must be [", query_start_loc ? "num_tokens" : "num_seqs",
                    ", num_heads, head_size], got ", shape_of(query));
  a.dtype = activation_dtype(op, "query", query);
  a.num_tokens = query.size(0);
  a.num_seqs = a.num_tokens;
  if (query_start_loc) {
    TORCH_CHECK_VALUE(query_start_loc->dim() == 1 && query_start_loc->size(0) >= 1, op,
                      ": query_start_loc must be [num_seqs + 1], got ", shape_of(*query_start_loc));
    expect_index_type(op, "query_start_loc", *query_start_loc);
    expect_same_device(op, "query_start_loc", *query_start_loc, "out", out);
    a.num_seqs = query_start_loc->size(0) - 1;
  }
  a.num_heads = query.size(1);
  a.head_size = query.size(2);
  expect_shape(op, "out", out, query.sizes());
  expect_dtype(op, "out", out, query.scalar_type());
  expect_contiguous(op, "out", out);
  expect_one_device(op, {{"out", &out}, {"query", &query}, {"key_cache", &key_cache}, {"value_cache", &value_cache},
                         {"block_tables", &block_tables}, {"seq_lens", &seq_lens}});
  expect_scale_device(op, "k_scale", k_scale, out);
  expect_scale_device(op, "v_scale", v_scale, out);
  a.cache_dtype = cache_dtype_of(op, kv_cache_dtype, key_cache, a.dtype, query);
  expect_dtype(op, "value_cache", value_cache, key_cache.scalar_type());
  const int64_t x = 16 / element_bytes(a.cache_dtype);
  TORCH_CHECK_VALUE(key_cache.dim() == 5, op, ": key_cache must be [num_blocks, num_kv_heads, head_size/x, block_size, x], got ",
                    shape_of(key_cache));
  a.num_blocks = key_cache.size(0);
  a.num_kv_heads = num_kv_heads;
  a.block_size = block_size;
  TORCH_CHECK_VALUE(a.head_size % x == 0, op, ": head_size ", a.head_size, " is not a multiple of x = ", x);
  expect_shape(op, "key_cache", key_cache, {a.num_blocks, num_kv_heads, a.head_size / x, block_size, x});
  expect_shape(op, "value_cache", value_cache, {a.num_blocks, num_kv_heads, a.head_size, block_size});
  expect_contiguous(op, "key_cache", key_cache);
  expect_contiguous(op, "value_cache", value_cache);
  TORCH_CHECK_VALUE(block_tables.dim() == 2 && block_tables.size(0) == a.num_seqs, op,
                    ": block_tables must be [num_seqs = ", a.num_seqs, ", max_blocks_per_seq], got ", shape_of(block_tables));
  a.max_blocks_per_seq = block_tables.size(1);
  expect_index_type(op, "block_tables", block_tables);
  expect_shape(op, "seq_lens", seq_lens, {a.num_seqs});
  expect_index_type(op, "seq_lens", seq_lens);
  a.max_seq_len = args.max_seq_len;
  a.has_alibi = alibi_slopes.has_value();
  if (a.has_alibi) {
    expect_shape(op, "alibi_slopes", *alibi_slopes, {a.num_heads});
    expect_dtype(op, "alibi_slopes", *alibi_slopes, at::kFloat);
    expect_same_device(op, "alibi_slopes", *alibi_slopes, "out", out);
  }
  expect_scale(op, "k_scale", k_scale);
  expect_scale(op, "v_scale", v_scale);
  TORCH_CHECK_VALUE(tp_rank >= INT_MIN && tp_rank <= INT_MAX, op, ": tp_rank ", tp_rank, " is outside int");
  a.tp_rank = static_cast<int>(tp_rank);
  // vLLM's rule: the block-sparse pattern is on when the vertical stride exceeds 1.
  a.is_sparse = args.blocksparse_vert_stride > 1;
  if (a.is_sparse) {
    for (const int64_t v : {args.blocksparse_local_blocks, args.blocksparse_vert_stride, args.blocksparse_block_size,
                            args.blocksparse_head_sliding_step}) {
      TORCH_CHECK_VALUE(v >= INT_MIN && v <= INT_MAX, op, ": blocksparse argument ", v, " is outside int");
    }
    a.sparse = kpa_block_sparse{static_cast<int>(args.blocksparse_local_blocks),
                                static_cast<int>(args.blocksparse_vert_stride),
                                static_cast<int>(args.blocksparse_block_size),
                                static_cast<int>(args.blocksparse_head_sliding_step)};
  }
  return a;
}

/// A tensor's data, or NULL when it has none (the C ABI accepts NULL exactly where nothing is read).
void* data_or_null(const at::Tensor& t) { return t.defined() && t.numel() > 0 ? t.data_ptr() : nullptr; }

/// Reads what the C ABI call needs: the query made contiguous (a strided view of a fused qkv
/// tensor is gathered, num_seqs x num_heads x head_size elements), int32 tables, the scales'
/// values (fp8 caches only: "auto" caches ignore them).
void prepare(const char* op, Attention& a, const Launch& launch, const AttentionArgs& args) {
  a.query = args.query.contiguous();
  if (args.query_start_loc) a.query_start_loc = as_int32(op, "query_start_loc", *args.query_start_loc);
  a.block_tables = as_int32(op, "block_tables", args.block_tables);
  a.seq_lens = as_int32(op, "seq_lens", args.seq_lens);
  if (a.has_alibi) a.alibi = args.alibi_slopes->contiguous();
  if (a.cache_dtype == KPA_FP8_E4M3 || a.cache_dtype == KPA_FP8_E5M2) {
    a.k_scale = scale_value(op, args.k_scale, launch);
    a.v_scale = scale_value(op, args.v_scale, launch);
  }
}

void paged_attention_v1(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t block_size,
                        int64_t max_seq_len, const c10::optional<at::Tensor>& alibi_slopes,
                        const std::string& kv_cache_dtype, const at::Tensor& k_scale, const at::Tensor& v_scale,
                        int64_t tp_rank, int64_t blocksparse_local_blocks, int64_t blocksparse_vert_stride,
                        int64_t blocksparse_block_size, int64_t blocksparse_head_sliding_step) {
  constexpr const char* op = "kpa.paged_attention_v1";
  const AttentionArgs args =
      AttentionArgs(out, query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens, block_size, max_seq_len,
                    alibi_slopes, kv_cache_dtype, k_scale, v_scale)
          .with_block_sparse(tp_rank, blocksparse_local_blocks, blocksparse_vert_stride, blocksparse_block_size,
                             blocksparse_head_sliding_step);
  Attention a = check_attention(op, args);
  const Where where = where_of(op, out);
  if (where == Where::Meta) return;  // the checks are the whole operator
  const Launch launch = run_on(op, where, out);
  prepare(op, a, launch, args);
  launch.kpa->check(launch.kpa->paged_attention_v1(
      data_or_null(out), data_or_null(a.query), a.dtype, data_or_null(key_cache), data_or_null(value_cache), a.cache_dtype,
      a.num_seqs, a.num_heads, a.num_kv_heads, a.head_size, a.num_blocks, a.block_size,
      static_cast<const int32_t*>(data_or_null(a.block_tables)), a.max_blocks_per_seq,
      static_cast<const int32_t*>(data_or_null(a.seq_lens)), a.max_seq_len, static_cast<float>(scale),
      a.has_alibi ? a.alibi.data_ptr<float>() : nullptr, a.k_scale, a.v_scale, a.tp_rank,
      a.is_sparse ? &a.sparse : nullptr));
}

void paged_attention_v2(at::Tensor& out, at::Tensor& exp_sums, at::Tensor& max_logits, at::Tensor& tmp_out,
                        const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                        int64_t num_kv_heads, double scale, const at::Tensor& block_tables,
                        const at::Tensor& seq_lens, int64_t block_size, int64_t max_seq_len,
                        const c10::optional<at::Tensor>& alibi_slopes, const std::string& kv_cache_dtype,
                        const at::Tensor& k_scale, const at::Tensor& v_scale, int64_t tp_rank,
                        int64_t blocksparse_local_blocks, int64_t blocksparse_vert_stride,
                        int64_t blocksparse_block_size, int64_t blocksparse_head_sliding_step) {
  constexpr const char* op = "kpa.paged_attention_v2";
  const AttentionArgs args =
      AttentionArgs(out, query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens, block_size, max_seq_len,
                    alibi_slopes, kv_cache_dtype, k_scale, v_scale)
          .with_block_sparse(tp_rank, blocksparse_local_blocks, blocksparse_vert_stride, blocksparse_block_size,
                             blocksparse_head_sliding_step);
  Attention a = check_attention(op, args);
  TORCH_CHECK_VALUE(exp_sums.dim() == 3, op, ": exp_sums must be [num_seqs, num_heads, max_num_partitions], got ",
                    shape_of(exp_sums));
  const int64_t partitions = exp_sums.size(2);
  expect_shape(op, "exp_sums", exp_sums, {a.num_seqs, a.num_heads, partitions});
  expect_shape(op, "max_logits", max_logits, {a.num_seqs, a.num_heads, partitions});
  expect_shape(op, "tmp_out", tmp_out, {a.num_seqs, a.num_heads, partitions, a.head_size});
  expect_dtype(op, "exp_sums", exp_sums, at::kFloat);
  expect_dtype(op, "max_logits", max_logits, at::kFloat);
  expect_dtype(op, "tmp_out", tmp_out, out.scalar_type());
  for (const Named& t : {Named{"exp_sums", &exp_sums}, Named{"max_logits", &max_logits}, Named{"tmp_out", &tmp_out}}) {
    expect_contiguous(op, t.first, *t.second);
  }
  expect_one_device(op, {{"out", &out}, {"exp_sums", &exp_sums}, {"max_logits", &max_logits}, {"tmp_out", &tmp_out}});
  const Where where = where_of(op, out);
  if (where == Where::Meta) return;
  const Launch launch = run_on(op, where, out);
  prepare(op, a, launch, args);
  launch.kpa->check(launch.kpa->paged_attention_v2(
      data_or_null(out), static_cast<float*>(data_or_null(exp_sums)), static_cast<float*>(data_or_null(max_logits)),
      data_or_null(tmp_out), partitions, kPartitionSize, data_or_null(a.query), a.dtype,
      data_or_null(key_cache), data_or_null(value_cache), a.cache_dtype, a.num_seqs, a.num_heads, a.num_kv_heads,
      a.head_size, a.num_blocks, a.block_size, static_cast<const int32_t*>(data_or_null(a.block_tables)),
      a.max_blocks_per_seq, static_cast<const int32_t*>(data_or_null(a.seq_lens)), a.max_seq_len,
      static_cast<float>(scale), a.has_alibi ? a.alibi.data_ptr<float>() : nullptr, a.k_scale, a.v_scale,
      a.tp_rank, a.is_sparse ? &a.sparse : nullptr));
}

/// kpa's automatic entry point with the variants: several query tokens per sequence (vLLM's
/// query_start_loc; each attends the keys up to its own position), a soft cap, a sliding window
/// and sinks, besides v1 / v2's arguments (no block-sparse pattern, no tp_rank).
void paged_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
                     const at::Tensor& value_cache, int64_t num_kv_heads, double scale, const at::Tensor& block_tables,
                     const at::Tensor& seq_lens, const c10::optional<at::Tensor>& query_start_loc,
                     int64_t max_seq_len, const c10::optional<at::Tensor>& alibi_slopes,
                     const std::string& kv_cache_dtype, const at::Tensor& k_scale, const at::Tensor& v_scale,
                     double logits_soft_cap, int64_t sliding_window, const c10::optional<at::Tensor>& sinks) {
  constexpr const char* op = "kpa.paged_attention";
  // The schema has no block_size: the cache's is taken.
  AttentionArgs args(out, query, key_cache, value_cache, num_kv_heads, block_tables, seq_lens,
                     key_cache.dim() == 5 ? key_cache.size(3) : 0, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale,
                     v_scale);
  args.query_start_loc = query_start_loc;
  Attention a = check_attention(op, args);
  TORCH_CHECK_VALUE(logits_soft_cap >= 0, op, ": logits_soft_cap must be 0 (off) or positive, got ", logits_soft_cap);
  TORCH_CHECK_VALUE(sliding_window >= 0 && sliding_window <= INT_MAX, op,
                    ": sliding_window must be 0 (off) or a positive int, got ", sliding_window);
  if (sinks) {
    expect_shape(op, "sinks", *sinks, {a.num_heads});
    expect_dtype(op, "sinks", *sinks, at::kFloat);
    expect_same_device(op, "sinks", *sinks, "out", out);
  }
  const Where where = where_of(op, out);
  if (where == Where::Meta) return;
  const Launch launch = run_on(op, where, out);
  prepare(op, a, launch, args);
  const at::Tensor sink_values = sinks ? sinks->contiguous() : at::Tensor();
  kpa_attention_options options;
  launch.kpa->attention_options_init(&options);
  options.scale = static_cast<float>(scale);
  options.k_scale = a.k_scale;
  options.v_scale = a.v_scale;
  options.alibi_slopes = a.has_alibi ? a.alibi.data_ptr<float>() : nullptr;
  options.logits_soft_cap = static_cast<float>(logits_soft_cap);
  options.sliding_window = static_cast<int>(sliding_window);
  options.sinks = sinks ? sink_values.data_ptr<float>() : nullptr;
  options.query_start_loc = query_start_loc ? static_cast<const int32_t*>(a.query_start_loc.data_ptr()) : nullptr;
  options.num_tokens = a.num_tokens;
  options.check_indices = indices_checked() ? 1 : 0;
  launch.kpa->check(launch.kpa->paged_attention_ex(
      data_or_null(out), data_or_null(a.query), a.dtype, data_or_null(key_cache), data_or_null(value_cache),
      a.cache_dtype, a.num_seqs, a.num_heads, a.num_kv_heads, a.head_size, a.num_blocks, a.block_size,
      static_cast<const int32_t*>(data_or_null(a.block_tables)), a.max_blocks_per_seq,
      static_cast<const int32_t*>(data_or_null(a.seq_lens)), a.max_seq_len, &options));
}

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache, at::Tensor& value_cache,
                       const at::Tensor& slot_mapping, const std::string& kv_cache_dtype, const at::Tensor& k_scale,
                       const at::Tensor& v_scale) {
  constexpr const char* op = "kpa.reshape_and_cache";
  TORCH_CHECK_VALUE(key.dim() == 3, op, ": key must be [num_tokens, num_kv_heads, head_size], got ", shape_of(key));
  const kpa_dtype dtype = activation_dtype(op, "key", key);
  const int64_t tokens = key.size(0), kv_heads = key.size(1), head_size = key.size(2);
  expect_shape(op, "value", value, key.sizes());
  expect_dtype(op, "value", value, key.scalar_type());
  expect_one_device(op, {{"key", &key}, {"value", &value}, {"key_cache", &key_cache}, {"value_cache", &value_cache},
                         {"slot_mapping", &slot_mapping}});
  expect_scale_device(op, "k_scale", k_scale, key);
  expect_scale_device(op, "v_scale", v_scale, key);
  const kpa_dtype cache_dtype = cache_dtype_of(op, kv_cache_dtype, key_cache, dtype, key);
  expect_dtype(op, "value_cache", value_cache, key_cache.scalar_type());
  const int64_t x = 16 / element_bytes(cache_dtype);
  TORCH_CHECK_VALUE(key_cache.dim() == 5, op, ": key_cache must be [num_blocks, num_kv_heads, head_size/x, block_size, x], got ",
                    shape_of(key_cache));
  const int64_t blocks = key_cache.size(0), block_size = key_cache.size(3);
  TORCH_CHECK_VALUE(head_size % x == 0, op, ": head_size ", head_size, " is not a multiple of x = ", x);
  expect_shape(op, "key_cache", key_cache, {blocks, kv_heads, head_size / x, block_size, x});
  expect_shape(op, "value_cache", value_cache, {blocks, kv_heads, head_size, block_size});
  expect_contiguous(op, "key_cache", key_cache);
  expect_contiguous(op, "value_cache", value_cache);
  expect_shape(op, "slot_mapping", slot_mapping, {tokens});
  expect_index_type(op, "slot_mapping", slot_mapping);
  expect_scale(op, "k_scale", k_scale);
  expect_scale(op, "v_scale", v_scale);
  const Where where = where_of(op, key);
  if (where == Where::Meta) return;
  const Launch launch = run_on(op, where, key);
  // key and value are often views of a fused qkv tensor: the C ABI takes them contiguous.
  const at::Tensor k = key.contiguous(), v = value.contiguous();
  const at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
  const bool fp8 = cache_dtype == KPA_FP8_E4M3 || cache_dtype == KPA_FP8_E5M2;
  launch.kpa->check(launch.kpa->reshape_and_cache(data_or_null(k), data_or_null(v), dtype, data_or_null(key_cache),
                                     data_or_null(value_cache), cache_dtype, tokens, kv_heads, head_size, blocks,
                                     block_size, static_cast<const int64_t*>(data_or_null(slots)),
                                     fp8 ? scale_value(op, k_scale, launch) : 1.0f,
                                     fp8 ? scale_value(op, v_scale, launch) : 1.0f));
}

/// A cache of copy_blocks / swap_blocks: contiguous, with a block per index of its first dimension.
void expect_cache(const char* op, const std::string& name, const at::Tensor& cache) {
  TORCH_CHECK_VALUE(cache.dim() >= 2, op, ": ", name, " must have a block dimension and the block's, got ", shape_of(cache));
  TORCH_CHECK_VALUE(cache.is_contiguous(), op, ": ", name, " must be contiguous");
}

/// The kpa_dtype of a cache's elements (copy_blocks copies them bit for bit; fp8 caches are uint8).
kpa_dtype storage_dtype(const char* op, const std::string& name, const at::Tensor& cache) {
  switch (cache.scalar_type()) {
    case at::kFloat: return KPA_F32;
    case at::kHalf: return KPA_F16;
    case at::kBFloat16: return KPA_BF16;
    case at::kByte: return KPA_FP8_E4M3;
    default: TORCH_CHECK_NOT_IMPLEMENTED(false, op, ": ", name, " is ", cache.scalar_type(),
                                         "; kpa's caches are float32, float16, bfloat16 or uint8 (fp8)");
  }
}

void copy_blocks(const std::vector<at::Tensor>& key_caches, const std::vector<at::Tensor>& value_caches,
                 const at::Tensor& block_mapping) {
  constexpr const char* op = "kpa.copy_blocks";
  TORCH_CHECK_VALUE(key_caches.size() == value_caches.size(), op, ": ", key_caches.size(), " key caches and ",
                    value_caches.size(), " value caches");
  TORCH_CHECK_VALUE(block_mapping.dim() == 2 && (block_mapping.size(0) == 0 || block_mapping.size(1) == 2), op,
                    ": block_mapping must be [num_pairs, 2], got ", shape_of(block_mapping));
  expect_index_type(op, "block_mapping", block_mapping);
  if (key_caches.empty()) return;
  const at::Tensor& first = key_caches[0];
  expect_cache(op, "key_caches[0]", first);
  // Every layer's caches have one shape and dtype: the C ABI copies whole blocks of one size.
  for (size_t l = 0; l < key_caches.size(); ++l) {
    for (const Named& side : {Named{"key_caches", &key_caches[l]}, Named{"value_caches", &value_caches[l]}}) {
      const at::Tensor* cache = side.second;
      const std::string name = std::string(side.first) + "[" + std::to_string(l) + "]";
      expect_cache(op, name, *cache);
      expect_same_device(op, name.c_str(), *cache, "key_caches[0]", first);
      expect_dtype(op, name.c_str(), *cache, first.scalar_type());
      // sym_*: meta tensors under tracing may have symbolic sizes.
      TORCH_CHECK_VALUE(cache->sym_numel() == first.sym_numel() && cache->sym_size(0) == first.sym_size(0), op, ": ", name,
                        " has shape ", shape_of(*cache), ", key_caches[0] ", shape_of(first));
    }
  }
  expect_same_device(op, "block_mapping", block_mapping, "key_caches[0]", first);
  const Where where = where_of(op, first);
  if (where == Where::Meta) return;
  const Launch launch = run_on(op, where, first);
  const int64_t layers = static_cast<int64_t>(key_caches.size());
  std::vector<void*> keys(layers), values(layers);
  for (int64_t l = 0; l < layers; ++l) {
    keys[l] = data_or_null(key_caches[l]);
    values[l] = data_or_null(value_caches[l]);
  }
  const at::Tensor mapping = block_mapping.to(at::kLong).contiguous();
  const int64_t blocks = first.size(0);
  launch.kpa->check(launch.kpa->copy_blocks(keys.data(), values.data(), layers, storage_dtype(op, "key_caches[0]", first), blocks,
                               blocks > 0 ? std::max<int64_t>(first.numel() / blocks, 1) : 1,
                               static_cast<const int64_t*>(data_or_null(mapping)), mapping.size(0)));
}

void swap_blocks(const at::Tensor& src, at::Tensor& dst, const at::Tensor& block_mapping) {
  constexpr const char* op = "kpa.swap_blocks";
  expect_cache(op, "src", src);
  expect_cache(op, "dst", dst);
  expect_dtype(op, "dst", dst, src.scalar_type());
  TORCH_CHECK_VALUE(src.sizes().slice(1) == dst.sizes().slice(1), op, ": src ", shape_of(src), " and dst ",
                    shape_of(dst), " differ beyond the block dimension");
  TORCH_CHECK_VALUE(block_mapping.dim() == 2 && (block_mapping.size(0) == 0 || block_mapping.size(1) == 2), op,
                    ": block_mapping must be [num_pairs, 2], got ", shape_of(block_mapping));
  expect_index_type(op, "block_mapping", block_mapping);
  TORCH_CHECK_VALUE(block_mapping.device().is_cpu() || block_mapping.is_meta(), op,
                    ": block_mapping lives on the CPU, not ", block_mapping.device());
  const Where src_where = where_of(op, src), dst_where = where_of(op, dst);
  if (src_where == Where::Meta || dst_where == Where::Meta) {
    TORCH_CHECK_VALUE(src_where == dst_where, op, ": src is on ", src.device(), ", dst on ", dst.device());
    return;
  }
  // Copies between host and GPU run on the GPU's stream; host to host on the host.
  const bool src_on_gpu = src_where == Where::Gpu;
  const bool on_gpu = src_on_gpu || dst_where == Where::Gpu;
  if (src_on_gpu && dst_where == Where::Gpu) expect_same_device(op, "dst", dst, "src", src);
  const Launch launch = run_on(op, on_gpu ? Where::Gpu : Where::Host, src_on_gpu ? src : dst);
  const auto memory = [](Where w) { return w == Where::Gpu ? KPA_MEMORY_DEFAULT : KPA_MEMORY_HOST; };
  const at::Tensor mapping = block_mapping.to(at::kLong).contiguous();
  const int64_t block_bytes = src.size(0) > 0 ? src.numel() / src.size(0) * src.element_size() : 0;
  launch.kpa->check(launch.kpa->swap_blocks(data_or_null(src), memory(src_where), src.size(0), data_or_null(dst),
                               memory(dst_where), dst.size(0), std::max<int64_t>(block_bytes, 1),
                               static_cast<const int64_t*>(data_or_null(mapping)), mapping.size(0)));
}

/// kpa.set_check_indices: whether the operators check the indices they follow (on by default);
/// returns the previous setting.
bool set_check_indices(bool enabled) {
  const std::lock_guard<std::mutex> lock(libraries_mutex);
  const bool previous = check_indices_setting.exchange(enabled);
  for (const KpaLibrary* started : {host_library.if_started(),
#ifdef KPA_TORCH_CUDA
                                    cuda_library.if_started(),
#endif
                                   }) {
    if (started != nullptr) started->set_check_indices(enabled ? 1 : 0);
  }
  return previous;
}

std::string version() {
  const KpaLibrary* library = host_library.loaded();
  TORCH_CHECK(library != nullptr, host_library.error());
  return library->version();
}

/// kpa.init_cuda: starts the CUDA back end now (the first call on CUDA tensors does otherwise);
/// raises RuntimeError saying why it cannot (no GPU, no driver).
void init_cuda() {
#ifdef KPA_TORCH_CUDA
  cuda_kpa();
#else
  TORCH_CHECK_NOT_IMPLEMENTED(false, "kpa.init_cuda: this kpa was built for CPU tensors only (a host build of "
                                     "libkpa); CUDA tensors need kpa built with its CUDA back end (see the README)");
#endif
}

bool built_for_cuda() {
#ifdef KPA_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

std::string host_isa() { return host_kpa().host_isa(); }

}  // namespace

// The schemas are vLLM's (csrc/torch_bindings.cpp): outputs are mutated in place, nothing is returned.
TORCH_LIBRARY(kpa, m) {
  m.def(
      "paged_attention_v1(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, "
      "float scale, Tensor block_tables, Tensor seq_lens, int block_size, int max_seq_len, Tensor? alibi_slopes, "
      "str kv_cache_dtype, Tensor k_scale, Tensor v_scale, int tp_rank, int blocksparse_local_blocks, "
      "int blocksparse_vert_stride, int blocksparse_block_size, int blocksparse_head_sliding_step) -> ()");
  m.def(
      "paged_attention_v2(Tensor(a!) out, Tensor(b!) exp_sums, Tensor(c!) max_logits, Tensor(d!) tmp_out, "
      "Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, float scale, Tensor block_tables, "
      "Tensor seq_lens, int block_size, int max_seq_len, Tensor? alibi_slopes, str kv_cache_dtype, Tensor k_scale, "
      "Tensor v_scale, int tp_rank, int blocksparse_local_blocks, int blocksparse_vert_stride, "
      "int blocksparse_block_size, int blocksparse_head_sliding_step) -> ()");
  m.def(
      "paged_attention(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, "
      "float scale, Tensor block_tables, Tensor seq_lens, Tensor? query_start_loc, int max_seq_len, "
      "Tensor? alibi_slopes, str kv_cache_dtype, Tensor k_scale, Tensor v_scale, float logits_soft_cap=0., "
      "int sliding_window=0, Tensor? sinks=None) -> ()");
  m.def(
      "reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
      "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()");
  m.def("copy_blocks(Tensor(a!)[] key_caches, Tensor(b!)[] value_caches, Tensor block_mapping) -> ()");
  m.def("swap_blocks(Tensor src, Tensor(a!) dst, Tensor block_mapping) -> ()");
  m.def("set_check_indices(bool enabled) -> bool", &set_check_indices);
  m.def("version() -> str", &version);
  m.def("built_for_cuda() -> bool", &built_for_cuda);
  m.def("init_cuda() -> ()", &init_cuda);
  m.def("host_isa() -> str", &host_isa);
}

namespace {

constexpr const char* kTensorOperators[] = {"paged_attention_v1", "paged_attention_v2", "paged_attention",
                                            "reshape_and_cache", "copy_blocks", "swap_blocks"};

void register_kernels(torch::Library& m) {
  m.impl("paged_attention_v1", &paged_attention_v1);
  m.impl("paged_attention_v2", &paged_attention_v2);
  m.impl("paged_attention", &paged_attention);
  m.impl("reshape_and_cache", &reshape_and_cache);
  m.impl("copy_blocks", &copy_blocks);
  m.impl("swap_blocks", &swap_blocks);
}

#ifndef KPA_TORCH_CUDA
/// CUDA tensors on a build for CPU tensors: a clear error instead of torch's "no kernel for CUDA".
void refuse_gpu_tensors(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().name(),
                              ": this kpa was built for CPU tensors only (a host build of libkpa); CUDA tensors need "
                              "kpa built with its CUDA back end (see the README)");
}
#endif

}  // namespace

TORCH_LIBRARY_IMPL(kpa, CPU, m) { register_kernels(m); }

// Meta tensors (tracing, shape propagation): the same checks, no data touched.
TORCH_LIBRARY_IMPL(kpa, Meta, m) { register_kernels(m); }

// The operators have no gradient. Autograd passes CPU and CUDA tensors through to the kernels on
// every torch; torch 1.13 has no such default for meta tensors, so it is given here.
TORCH_LIBRARY_IMPL(kpa, AutogradMeta, m) {
  for (const char* op : kTensorOperators) m.impl(op, torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(kpa, CUDA, m) {
#ifdef KPA_TORCH_CUDA
  register_kernels(m);
#else
  for (const char* op : kTensorOperators) m.impl(op, torch::CppFunction::makeFromBoxedFunction<&refuse_gpu_tensors>());
#endif
}
