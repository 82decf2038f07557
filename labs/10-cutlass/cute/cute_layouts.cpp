// Lab skeleton generated from solutions/10-cutlass/cute/cute_layouts.cpp by `./course labs` [lab-hash d8da1036f88e].
// Students: fill in the TODO(lab10.k) blocks, then run `./course grade 10`.
// Instructors: edit the solution file instead, then run `./course labs`.
// Lesson 05's layouts written as CuTe layouts (lesson 10, the CuTe reading). Host-only: CuTe's layout
// algebra is constexpr integer arithmetic, and print_layout runs on the CPU, so this builds with the host
// compiler (through nvcc, which adds CUDA's and CCCL's include folders) and needs no GPU.
//
//   nvcc -std=c++17 -O1 -I<cutlass>/include cute_layouts.cpp -o cute_layouts   (python3 -m coursekit.cutlass --flags)
//   ./cute_layouts            the tables, for the page
//   ./cute_layouts --dump     one line per element, for tests/grader10/cute_layouts.py, which checks each one
//                             against lesson 05's own functions (solutions/05-tensor-cores/mma.cuh)
//
// What is here, and what in lesson 05 it is:
//  (a) the shared-memory swizzle of linear_act.cu: tile rows of kBlockK = 32 bf16 (64 B, 4 chunks of 16 B),
//      chunk c of row r stored at chunk c ^ ((r / 2) % 4) (swizzled_chunk<4>). In CuTe that is
//      Swizzle<2,3,3> composed with the row-major (8,32):(32,1) atom: an offset's bits 3-4 (the chunk) are
//      XORed with its bits 6-7 (= row bits 1-2, i.e. (r / 2) % 4). tile_to_shape repeats the atom down the
//      128 rows of a block tile, as CUTLASS's sm80 GEMMs build their SmemLayout. Also the 64-element rows of
//      swizzled_chunk<8> (kBlockK = 64): Swizzle<3,3,3> o (8,64):(64,1), chunk c ^ (r % 8).
//  (b) the Hopper path's TMA/wgmma 128-byte swizzle (linear_act_wgmma.cu: chunk c of row r at c ^ (r % 8)):
//      CuTe's own GMMA::Layout_K_SW128_Atom<bf16>, not built by hand here; evaluated through a tensor on a
//      1024-byte-aligned shared-memory pointer, because that swizzle acts on the byte address.
//  (c) the fragments of mma.sync.m16n8k16 bf16 (SM80_16x8x16_F32BF16BF16F32_TN): CuTe's thread-value
//      layouts (thread, value) -> (row, column) of A (16x16), B (n 8 x k 16) and C (16x8); and with two n8
//      atoms side by side (Tile<_16,_16,_16>), B over n 16, which is what one ldmatrix.x4 of the weight
//      tile fills in lesson 05 (its pair[0..3]).
//  (d) ldmatrix.x4 (SM75_U32x4_LDSM_N) retiled to those fragments by make_tiled_copy_A/B: the source
//      layout says which 8 consecutive elements each lane's row address points at: ldmatrix_a_source and
//      ldmatrix_b_source of lesson 05.
// cute/tensor.hpp first: the atom headers use Tensor and Copy_Atom without including what declares them.
#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/copy_traits_sm75.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm80.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>

using namespace cute;

namespace {

using Element = bfloat16_t;
using Mma = MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>;
using Ldsm = Copy_Atom<SM75_U32x4_LDSM_N, Element>;

// (a) lesson 05's swizzle atoms and the block tiles made of them
auto swizzle_atom_32() { return composition(Swizzle<2, 3, 3>{}, Layout<Shape<_8, _32>, Stride<_32, _1>>{}); }
auto swizzle_atom_64() { return composition(Swizzle<3, 3, 3>{}, Layout<Shape<_8, _64>, Stride<_64, _1>>{}); }
auto swizzle_tile_32() { return tile_to_shape(swizzle_atom_32(), Shape<_128, _32>{}); }  // kBlockM x kBlockK
auto swizzle_tile_64() { return tile_to_shape(swizzle_atom_64(), Shape<_128, _64>{}); }
// (b) CuTe's 128-byte swizzle atom for K-major bf16 wgmma operands, tiled to the Hopper path's 128 x 64 tile
auto gmma_tile() { return tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{}, Shape<_128, _64>{}); }

// (c) one mma atom, and two side by side along n
auto mma_1x() { return make_tiled_mma(Mma{}); }
auto mma_n16() { return make_tiled_mma(Mma{}, Layout<Shape<_1, _1, _1>>{}, Tile<_16, _16, _16>{}); }

// A thread-value layout maps (thread, value) to an index into its tile, column-major (rows fastest):
// index = row + rows * column. Printed as (row, column).
template <class TV>
void dump_tv(const char* name, TV tv, int rows) {
  for (int t = 0; t < size<0>(tv); ++t)
    for (int v = 0; v < size<1>(tv); ++v) {
      const int index = tv(t, v);
      std::printf("%s %d %d %d %d\n", name, t, v, index % rows, index / rows);
    }
}

template <class L>
void dump_offsets(const char* name, L layout) {
  for (int r = 0; r < size<0>(layout); ++r)
    for (int c = 0; c < size<1>(layout); ++c) std::printf("%s %d %d %d\n", name, r, c, int(layout(r, c)));
}

// The swizzle of (b) acts on the shared-memory byte address: evaluate it where it acts, through a
// tensor on a pointer aligned to the swizzle's 1024-byte period (never dereferenced).
alignas(1024) Element g_smem_stand_in[128 * 64];
template <class L>
void dump_offsets_through_pointer(const char* name, L layout) {
  auto tensor = make_tensor(make_smem_ptr(g_smem_stand_in), layout);
  for (int r = 0; r < size<0>(layout); ++r)
    for (int c = 0; c < size<1>(layout); ++c)
      std::printf("%s %d %d %d\n", name, r, c, int(&tensor(r, c) - g_smem_stand_in));
}

// A table like CuTe's print_latex, as text: cell (row, column) holds "T<thread>V<value>".
template <class TV>
void print_tv_table(const char* title, TV tv, int rows, int cols, bool transposed = false) {
  std::printf("\n%s\n", title);
  static char cell[64][64][12];
  for (int t = 0; t < size<0>(tv); ++t)
    for (int v = 0; v < size<1>(tv); ++v) {
      const int index = tv(t, v);
      int r = index % rows, c = index / rows;
      std::snprintf(cell[r][c], sizeof(cell[r][c]), "T%dV%d", t, v);
    }
  const int shown_rows = transposed ? cols : rows, shown_cols = transposed ? rows : cols;
  std::printf("      ");
  for (int c = 0; c < shown_cols; ++c) std::printf("%6d", c);
  std::printf("\n");
  for (int r = 0; r < shown_rows; ++r) {
    std::printf("%4d  ", r);
    for (int c = 0; c < shown_cols; ++c) std::printf("%6s", transposed ? cell[c][r] : cell[r][c]);
    std::printf("\n");
  }
}

// (d) which lane sources each 8-element row of a 16x16 operand tile: cell (row, k / 8) = lane.
template <class TV>
void print_source_table(const char* title, TV tv, int rows) {
  std::printf("\n%s\n        k 0-7   k 8-15\n", title);
  int lane_of[16][2];
  for (int t = 0; t < size<0>(tv); ++t) {
    const int index = tv(t, 0);
    lane_of[index % rows][(index / rows) / 8] = t;
  }
  for (int r = 0; r < rows; ++r) std::printf("%4d  %7d  %7d\n", r, lane_of[r][0], lane_of[r][1]);
}

void print_tables() {
  std::printf("(a) lesson 05's shared-memory swizzle, one 8-row atom (offsets in elements; chunk = 8 elements)\n");
  std::printf("kBlockK = 32, swizzled_chunk<4>: ");
  print(swizzle_atom_32());
  std::printf("\n");
  print_layout(swizzle_atom_32());
  std::printf("kBlockK = 64, swizzled_chunk<8>: ");
  print(swizzle_atom_64());
  std::printf("\n");
  print_layout(swizzle_atom_64());
  std::printf("block tile 128 x 32: ");
  print(swizzle_tile_32());
  std::printf("\n\n(b) CuTe's GMMA::Layout_K_SW128_Atom<bf16> (the Hopper path's TMA swizzle): ");
  print(GMMA::Layout_K_SW128_Atom<Element>{});
  std::printf("\n");
  print_layout(GMMA::Layout_K_SW128_Atom<Element>{});

  std::printf("\n(c) SM80_16x8x16_F32BF16BF16F32_TN, thread-value layouts (thread, value) -> index, column-major\n");
  std::printf("A (m,k): ");
  print(mma_1x().get_layoutA_TV());
  std::printf("\nB (n,k): ");
  print(mma_1x().get_layoutB_TV());
  std::printf("\nC (m,n): ");
  print(mma_1x().get_layoutC_TV());
  std::printf("\nB over two n8 atoms (n,k): ");
  print(mma_n16().get_layoutB_TV());
  std::printf("\n");
  print_tv_table("A: 16 x 16 (rows m, columns k); value v of a thread is bf16 v % 2 of register a[v / 2]",
                 mma_1x().get_layoutA_TV(), 16, 16);
  print_tv_table("B: 16 x 8 (rows k, columns n); value v is bf16 v % 2 of register b[v / 2]", mma_1x().get_layoutB_TV(),
                 8, 16, /*transposed=*/true);
  print_tv_table("C: 16 x 8 (rows m, columns n); value v is accumulator c[v]", mma_1x().get_layoutC_TV(), 16, 8);

  std::printf("\n(d) ldmatrix.x4 retiled to the fragments (make_tiled_copy_A/B): source (thread, value) -> index\n");
  auto copy_a = make_tiled_copy_A(Ldsm{}, mma_1x());
  auto copy_b = make_tiled_copy_B(Ldsm{}, mma_n16());
  std::printf("A source: ");
  print(copy_a.get_layoutS_TV());
  std::printf("\nB source (n 16): ");
  print(copy_b.get_layoutS_TV());
  std::printf("\nB destination (n 16): ");
  print(copy_b.get_layoutD_TV());
  std::printf("\n");
  print_source_table("A: the lane whose address is each 8-element row of the 16 x 16 x tile (ldmatrix_a_source)",
                     copy_a.get_layoutS_TV(), 16);
  print_source_table("B: the same for the 16 (n) x 16 (k) weight tile (ldmatrix_b_source)", copy_b.get_layoutS_TV(),
                     16);
}

void dump() {
  dump_offsets("swizzle32", swizzle_tile_32());
  dump_offsets("swizzle64", swizzle_tile_64());
  dump_offsets_through_pointer("gmma_sw128", gmma_tile());
  dump_tv("mma_A", mma_1x().get_layoutA_TV(), 16);     // (m, k)
  dump_tv("mma_B", mma_1x().get_layoutB_TV(), 8);      // (n, k)
  dump_tv("mma_C", mma_1x().get_layoutC_TV(), 16);     // (m, n)
  dump_tv("mma_B16", mma_n16().get_layoutB_TV(), 16);  // (n, k), n over two atoms
  dump_tv("ldsm_A_src", make_tiled_copy_A(Ldsm{}, mma_1x()).get_layoutS_TV(), 16);
  dump_tv("ldsm_A_dst", make_tiled_copy_A(Ldsm{}, mma_1x()).get_layoutD_TV(), 16);
  dump_tv("ldsm_B_src", make_tiled_copy_B(Ldsm{}, mma_n16()).get_layoutS_TV(), 16);
  dump_tv("ldsm_B_dst", make_tiled_copy_B(Ldsm{}, mma_n16()).get_layoutD_TV(), 16);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--dump") == 0) {
    dump();
  } else {
    print_tables();
  }
  return 0;
}
