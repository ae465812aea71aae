// 2:4 sparse GEMMs on Hopper (SM90) through CUTLASS's structured-sparse collective, behind a C ABI.
//
//     D (m, n) = alpha * (A @ B),   alpha = (*scale_a) * (*scale_b)  (1 where a pointer is null)
//
//     A  (m, k) row-major (K-major), 2:4 along k, given compressed: values (m, k/2) and metadata,
//        both in CUTLASS's SM90 layout (written by sl_cutlass_compress, CUTLASS's own compressor)
//     B  (k, n): "t" variants read it K-major (memory (n, k) row-major, e.g. X for Z^T = S(W) X^T),
//        "n" variants N-major (memory (k, n) row-major, e.g. X for dW = MVUE(dZ^T) X)
//     D  bfloat16; "col" variants write it column-major (memory (n, m) row-major: Z for Z^T), "row" row-major
//     accumulate in float32; bf16 or E4M3 operands (E4M3: both A and B)
//
// The scales are read from device memory in the epilogue (a two-scalar broadcast reduced by a product),
// so a CUDA graph captures the product and a delayed-scaling recipe needs no host sync.
//
// Build: one object per variant (-DSL_VARIANT=i: parallel compiles) and one for the C entry points
// (-DSL_API); build.py does it. Every variant of one element type uses a K tile of 128, so they share one
// SparseConfig and one metadata layout: an operand compressed once is read by every variant (checked below).

#include <cstdint>
#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/transform/device/transform_universal_adapter.hpp"
#include "cutlass/transform/kernel/sparse_gemm_compressor.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

namespace sl {

using bf16 = cutlass::bfloat16_t;
using e4m3 = cutlass::float_e4m3_t;
using ColMajor = cutlass::layout::ColumnMajor;
using RowMajor = cutlass::layout::RowMajor;
using Problem = Shape<int, int, int, int>;  // (m, n, k, batch)

// status codes shared with ops.py
enum Status : int {
  kOk = 0, kCannotImplement = 1, kInitializeFailed = 2, kRunFailed = 3, kBadVariant = 4, kBadDtype = 5,
  kWorkspaceTooSmall = 6,
};

namespace sched {
using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using Ping = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using CoopFast = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;
using PingFast = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum;
}  // namespace sched

// the epilogue schedule that goes with a mainloop schedule
template <class S> struct EpilogueOf { using type = cutlass::epilogue::TmaWarpSpecialized; };
template <> struct EpilogueOf<sched::Coop> { using type = cutlass::epilogue::TmaWarpSpecializedCooperative; };
template <> struct EpilogueOf<sched::CoopFast> { using type = cutlass::epilogue::TmaWarpSpecializedCooperative; };

// B and D layouts of a variant: "t" = B K-major (ColumnMajor tag for a K x N operand), "n" = N-major
template <char B> struct LayoutBOf { using type = ColMajor; };
template <> struct LayoutBOf<'n'> { using type = RowMajor; };
template <char D> struct LayoutDOf { using type = ColMajor; };
template <> struct LayoutDOf<'r'> { using type = RowMajor; };

template <class Element, char BMajor, char DLayout, int TM, int TN, int TK, int CM, int CN, class Schedule>
struct SparseGemm {
  using ElementD = bf16;
  using LayoutB = typename LayoutBOf<BMajor>::type;
  using LayoutD = typename LayoutDOf<DLayout>::type;
  static constexpr int kAlignAB = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte TMA rows
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using Tile = Shape<Int<TM>, Int<TN>, Int<TK>>;
  using Cluster = Shape<Int<CM>, Int<CN>, _1>;

  // D = convert(alpha * acc), alpha the product of two broadcast scalars (device pointers, or values)
  using Alpha = cutlass::epilogue::fusion::Sm90ScalarBroadcast<float, Stride<_0, _0, int64_t>, 2>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementD, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      Alpha, cutlass::epilogue::fusion::Sm90AccFetch>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassSparseTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD, kAlignD,  // no C: beta is always 0
      ElementD, LayoutD, kAlignD, typename EpilogueOf<Schedule>::type, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassSparseTensorOp,
      Element, RowMajor, kAlignAB, Element, LayoutB, kAlignAB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Problem, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using SparseConfig = typename Mainloop::SparseConfig;
};

// The compressor's view of one element type: its SparseConfig is the GEMMs' (K tile 128)
template <class Element>
struct Compression {
  using Reference = SparseGemm<Element, 't', 'c', 128, 128, 128, 1, 1, sched::Coop>;
  using SparseConfig = typename Reference::SparseConfig;
  using ElementE = typename Reference::Mainloop::ElementE;
  using StrideA = cutlass::gemm::TagToStrideA_t<RowMajor>;
  using Utility = cutlass::transform::kernel::StructuredSparseCompressorUtility<Problem, Element, RowMajor, SparseConfig>;
  using Kernel = cutlass::transform::kernel::StructuredSparseCompressor<Problem, Element, RowMajor, SparseConfig,
                                                                        cutlass::arch::Sm90>;
  using Adapter = cutlass::transform::device::TransformUniversalAdapter<Kernel>;
};

inline int sm_count(int device) {
  static int counts[64] = {0};  // cudaDeviceGetAttribute per call is cheap, but not free on the host path
  if (device < 0 || device >= 64) return cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  if (counts[device] == 0) counts[device] = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  return counts[device];
}

// One GEMM call, or (run == false) only the workspace it needs / whether it can run this shape.
template <class G>
int gemm(const void* a, const void* e, const void* b, void* d, int m, int n, int k, const float* scale_a,
         const float* scale_b, void* workspace, size_t workspace_bytes, size_t* workspace_needed, bool run,
         cudaStream_t stream) {
  using Gemm = typename G::Gemm;
  using Mainloop = typename G::Mainloop;
  auto problem = Problem{m, n, k, 1};
  auto layout_a = G::SparseConfig::fill_layoutA(problem);
  auto layout_e = G::SparseConfig::fill_layoutE(problem);
  auto stride_b = cutlass::make_cute_packed_stride(typename Gemm::GemmKernel::StrideB{}, make_shape(n, k, 1));
  auto stride_d = cutlass::make_cute_packed_stride(typename Gemm::GemmKernel::StrideD{}, make_shape(m, n, 1));
  int device = 0;
  cudaGetDevice(&device);
  cutlass::KernelHardwareInfo hw{device, sm_count(device)};
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm, problem,
      {static_cast<typename Mainloop::ElementA const*>(a), layout_a,
       static_cast<typename Gemm::ElementB const*>(b), stride_b,
       static_cast<typename Mainloop::ElementE const*>(e), layout_e},
      {{}, nullptr, stride_d, static_cast<typename G::ElementD*>(d), stride_d}, hw};
  // EVT arguments: {alpha broadcast {values, pointers, strides}, accumulator fetch, multiply}
  args.epilogue.thread = {{{1.0f, 1.0f}, {scale_a, scale_b}, {}}, {}, {}};
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return kCannotImplement;
  size_t needed = Gemm::get_workspace_size(args);
  if (workspace_needed) *workspace_needed = needed;
  if (!run) return kOk;
  if (workspace_bytes < needed) return kWorkspaceTooSmall;
  Gemm op;
  if (op.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return kInitializeFailed;
  if (op.run(stream) != cutlass::Status::kSuccess) return kRunFailed;
  return kOk;
}

template <class Element>
int compressed_shape(int m, int k, int64_t* out) {
  using C = Compression<Element>;
  typename C::Utility utility(Problem{m, 1, k, 1},
                              cutlass::make_cute_packed_stride(typename C::StrideA{}, make_shape(m, k, 1)));
  out[0] = utility.get_tensorA_m_physical();
  out[1] = utility.get_tensorA_k_physical();
  out[2] = utility.get_metadata_m_physical();
  out[3] = utility.get_metadata_k_physical();
  out[4] = sizeof(typename C::ElementE);
  out[5] = C::Adapter::get_workspace_size(typename C::Adapter::Arguments{});
  return kOk;
}

template <class Element>
int compress(const void* a, int64_t lda, void* a_compressed, void* e, int m, int k, void* workspace,
             cudaStream_t stream) {
  using C = Compression<Element>;
  typename C::StrideA stride_a = cutlass::make_cute_packed_stride(typename C::StrideA{}, make_shape(m, k, 1));
  get<0>(stride_a) = lda;  // a row-major view with padded rows is fine
  int device = 0;
  cudaGetDevice(&device);
  typename C::Adapter::Arguments args{Problem{m, 1, k, 1}, {a, stride_a, a_compressed, e},
                                      {cutlass::KernelHardwareInfo{device, sm_count(device)}}};
  typename C::Adapter op;
  if (op.can_implement(args) != cutlass::Status::kSuccess) return kCannotImplement;
  if (op.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return kInitializeFailed;
  if (op.run(stream) != cutlass::Status::kSuccess) return kRunFailed;
  return kOk;
}

}  // namespace sl

// The variants: (element, B major, D layout, tile m n k, cluster m n, schedule). Keep SL_VARIANT_COUNT in step:
// build.py compiles one object per row. Names: "<element>.<b><d>.<tile>.<cluster>.<schedule>".
#define SL_VARIANT_COUNT 14
#define SL_VARIANTS(X)                                              \
  X(0, bf16, 't', 'c', 256, 128, 128, 2, 1, Coop, "bf16.tc.256x128x128.2x1.coop") \
  X(1, bf16, 't', 'c', 256, 128, 128, 1, 2, Coop, "bf16.tc.256x128x128.1x2.coop") \
  X(2, bf16, 't', 'c', 128, 256, 128, 1, 2, Coop, "bf16.tc.128x256x128.1x2.coop") \
  X(3, bf16, 't', 'c', 128, 256, 128, 2, 1, Coop, "bf16.tc.128x256x128.2x1.coop") \
  X(4, bf16, 'n', 'r', 256, 128, 128, 1, 2, Coop, "bf16.nr.256x128x128.1x2.coop") \
  X(5, bf16, 'n', 'r', 128, 256, 128, 1, 2, Coop, "bf16.nr.128x256x128.1x2.coop") \
  X(6, e4m3, 't', 'c', 128, 256, 128, 1, 2, CoopFast, "e4m3.tc.128x256x128.1x2.coopfast") \
  X(7, e4m3, 't', 'c', 256, 128, 128, 1, 2, CoopFast, "e4m3.tc.256x128x128.1x2.coopfast") \
  X(8, e4m3, 't', 'c', 256, 128, 128, 2, 1, CoopFast, "e4m3.tc.256x128x128.2x1.coopfast") \
  X(9, e4m3, 't', 'c', 128, 256, 128, 2, 1, CoopFast, "e4m3.tc.128x256x128.2x1.coopfast") \
  X(10, e4m3, 't', 'c', 128, 128, 128, 1, 2, Coop, "e4m3.tc.128x128x128.1x2.coop") \
  X(11, e4m3, 't', 'r', 128, 256, 128, 1, 2, CoopFast, "e4m3.tr.128x256x128.1x2.coopfast") \
  X(12, e4m3, 't', 'r', 256, 128, 128, 1, 2, CoopFast, "e4m3.tr.256x128x128.1x2.coopfast") \
  X(13, bf16, 't', 'r', 128, 128, 128, 1, 2, Coop, "bf16.tr.128x128x128.1x2.coop")

#define SL_GEMM_ARGS                                                                                       \
  const void *a, const void *e, const void *b, void *d, int m, int n, int k, const float *scale_a,          \
      const float *scale_b, void *workspace, size_t workspace_bytes, size_t *workspace_needed, int run,     \
      cudaStream_t stream
#define SL_CAT_(x, y) x##y
#define SL_CAT(x, y) SL_CAT_(x, y)

namespace sl {
template <int I> struct Variant;  // row I of the table: its element type and its GEMM (declared only)
#define SL_ROW(I, EL, BM, DL, TM, TN, TK, CM, CN, S, NAME)                                 \
  template <> struct Variant<I> {                                                          \
    using Element = EL;                                                                    \
    using type = SparseGemm<EL, BM, DL, TM, TN, TK, CM, CN, sched::S>;                     \
    static constexpr const char* name = NAME;                                              \
  };
SL_VARIANTS(SL_ROW)
#undef SL_ROW
}  // namespace sl

#if defined(SL_VARIANT)
// one object per variant (parallel compiles): only this row's kernel is instantiated
using SlThis = sl::Variant<SL_VARIANT>;
static_assert(cute::is_same_v<typename SlThis::type::SparseConfig,
                              typename sl::Compression<typename SlThis::Element>::SparseConfig>,
              "every variant must read the operand layout that sl_cutlass_compress writes");
extern "C" int SL_CAT(sl_cutlass_gemm_, SL_VARIANT)(SL_GEMM_ARGS) {
  return sl::gemm<typename SlThis::type>(a, e, b, d, m, n, k, scale_a, scale_b, workspace, workspace_bytes,
                                         workspace_needed, run != 0, stream);
}
#elif defined(SL_API)
// the entry points ops.py calls: the variant table, the compressor, and the dispatch to each variant's object
#define SL_DECLARE(I, ...) extern "C" int sl_cutlass_gemm_##I(SL_GEMM_ARGS);
SL_VARIANTS(SL_DECLARE)
#undef SL_DECLARE
using SlEntry = int (*)(SL_GEMM_ARGS);
#define SL_ENTRY(I, ...) sl_cutlass_gemm_##I,
static const SlEntry sl_entries[SL_VARIANT_COUNT] = {SL_VARIANTS(SL_ENTRY)};
#undef SL_ENTRY
#define SL_NAME(I, EL, BM, DL, TM, TN, TK, CM, CN, S, NAME) NAME,
static const char* sl_names[SL_VARIANT_COUNT] = {SL_VARIANTS(SL_NAME)};
#undef SL_NAME

extern "C" {

int sl_cutlass_variant_count() { return SL_VARIANT_COUNT; }

const char* sl_cutlass_variant_name(int i) { return (i >= 0 && i < SL_VARIANT_COUNT) ? sl_names[i] : ""; }

// D = (*scale_a)(*scale_b) A B with variant i. run == 0: only check the shape and report the workspace size.
int sl_cutlass_gemm(int i, SL_GEMM_ARGS) {
  if (i < 0 || i >= SL_VARIANT_COUNT) return sl::kBadVariant;
  return sl_entries[i](a, e, b, d, m, n, k, scale_a, scale_b, workspace, workspace_bytes, workspace_needed, run,
                       stream);
}

// dtype: 0 bfloat16, 1 float8_e4m3fn. out: m and k of the compressed values (elements), m and k of the
// metadata (its elements), bytes per metadata element, workspace bytes of the compressor.
int sl_cutlass_compressed_shape(int dtype, int m, int k, int64_t* out) {
  if (dtype == 0) return sl::compressed_shape<sl::bf16>(m, k, out);
  if (dtype == 1) return sl::compressed_shape<sl::e4m3>(m, k, out);
  return sl::kBadDtype;
}

// a (m, k) row-major with leading dimension lda, 2:4 along k (at most two non-zeros, -0.0 counted as zero, in
// each group of four) -> compressed values and metadata in the layout every variant of that dtype reads.
int sl_cutlass_compress(int dtype, const void* a, int64_t lda, void* a_compressed, void* e, int m, int k,
                        void* workspace, cudaStream_t stream) {
  if (dtype == 0) return sl::compress<sl::bf16>(a, lda, a_compressed, e, m, k, workspace, stream);
  if (dtype == 1) return sl::compress<sl::e4m3>(a, lda, a_compressed, e, m, k, workspace, stream);
  return sl::kBadDtype;
}

const char* sl_cutlass_last_cuda_error() { return cudaGetErrorString(cudaGetLastError()); }

}  // extern "C"
#endif
