// MatrixView: a non-owning, row-major, strided view of a 2-D array.
//
// Element (r, c) is data[r * stride + c], for 0 <= r < rows and 0 <= c < cols.
// A stride of 0 given to the constructor means dense (cols): the one rule for
// strides in both APIs (the C API builds its views with this constructor). A
// view whose stride field is set below cols afterwards, 0 included, is an
// error.
// A column block of a wider matrix (one attention head of a [tokens, heads *
// head_dim] projection, say) is a view with data offset to the block and stride
// equal to the wide matrix's row length. Sizes are signed so that a negative
// size from a caller is reported, not wrapped around.
#ifndef HEADWAY_VIEW_H_
#define HEADWAY_VIEW_H_

#include <cstdint>
#include <type_traits>

namespace headway {

template <typename T>
struct MatrixView {
  MatrixView() = default;
  // [rows, cols], rows `stride` elements apart; stride 0 means cols (dense).
  MatrixView(T* data, int64_t rows, int64_t cols, int64_t stride)
      : data(data),
        rows(rows),
        cols(cols),
        stride(stride == 0 ? cols : stride) {}
  // [rows, cols], densely packed (stride == cols).
  MatrixView(T* data, int64_t rows, int64_t cols)
      : MatrixView(data, rows, cols, cols) {}
  // A mutable view converts to a const one.
  template <typename U,
            typename = std::enable_if_t<std::is_same_v<const U, T> &&
                                        !std::is_same_v<U, T>>>
  MatrixView(const MatrixView<U>& other)  // NOLINT: implicit by design
      : data(other.data),
        rows(other.rows),
        cols(other.cols),
        stride(other.stride) {}

  T* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // elements from one row's start to the next, >= cols
};

}  // namespace headway

#endif  // HEADWAY_VIEW_H_
