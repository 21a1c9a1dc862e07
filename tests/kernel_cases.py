"""Tile programs the kernel tests compile and run, with shapes small enough for PoCL."""

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"

CASES = {
    "matmul_odd": (MATMUL, {"A": (37, 53), "B": (53, 29)}),
    "matmul_64": (MATMUL, {"A": (64, 48), "B": (48, 64)}),
    "matmul_at": ("function (A[K, M], B[K, N]) -> (C) { C[m, n : M, N] = +(A[k, m] * B[k, n]); }",
                  {"A": (19, 33), "B": (19, 40)}),
    # B larger than L2: CPU models pack it in panels (`plan.pack`), the second with post-ops
    # reading the product through its split output index.
    "matmul_panels": (MATMUL, {"A": (136, 1024), "B": (1024, 288)}),
    "gemm_bias_relu_panels": (
        """function (A[M, K], B[K, N], bias[N]) -> (R) {
             C[m, n : M, N] = +(A[m, k] * B[k, n]);
             R = (C + bias > 0 ? C + bias : 0); }""",
        {"A": (160, 640), "B": (640, 448), "bias": (448,)}),
    "conv_same_relu": (
        """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (R) {
             O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, co, ci]);
             R = (O > 0 ? O : 0); }""",
        {"D": (2, 9, 7, 8), "K": (3, 3, 6, 8)}),
    "conv_valid": (
        """function (I[N, X, Y, C], K[KX, KY, C, F]) -> (O) {
             O[n, x, y, f : N, X - KX + 1, Y - KY + 1, F] =
                 +(I[n, x + i, y + j, c] * K[i, j, c, f]);
           }""",
        {"I": (1, 10, 8, 3), "K": (3, 2, 3, 5)}),
    "conv_strided": (
        """function (I[N, X, Y, C], K[KX, KY, C, F]) -> (O) {
             O[n, x, y, f : N, (X - KX) / 2 + 1, (Y - KY) / 2 + 1, F] =
                 +(I[n, 2*x + i, 2*y + j, c] * K[i, j, c, f]); }""",
        {"I": (2, 11, 9, 4), "K": (3, 3, 4, 6)}),
    "conv_dilated": (
        """function (I[N, X, Y, C], K[KX, KY, C, F]) -> (O) {
             O[n, x, y, f : N, X - 4, Y - 4, F] =
                 +(I[n, x + 2*i, y + 2*j, c] * K[i, j, c, f]); }""",
        {"I": (1, 12, 10, 3), "K": (3, 3, 3, 4)}),
    "depthwise": (
        """function (I[N, X, Y, C], K[KX, KY, C]) -> (O) {
             O[n, x, y, c : N, X, Y, C] = +(I[n, x + i - 1, y + j - 1, c] * K[i, j, c]); }""",
        {"I": (1, 9, 9, 16), "K": (3, 3, 16)}),
    "maxpool": (
        """function (I[N, X, Y, C]) -> (O) {
             O[n, x, y, c : N, X / 2, Y / 2, C] = >(I[n, 2*x + i, 2*y + j, c]), i < 2, j < 2; }""",
        {"I": (2, 8, 6, 5)}),
    "avgpool": (
        """function (I[N, X, Y, C]) -> (O) {
             S[n, x, y, c : N, X / 2, Y / 2, C] = +(I[n, 2*x + i, 2*y + j, c]), i < 2, j < 2;
             O = S / 4.0; }""",
        {"I": (1, 8, 8, 16)}),
    "softmax": (
        """function (X[R, C]) -> (Y) {
             M[r, 0 : R, 1] = >(X[r, c]); E = exp(X - M);
             S[r, 0 : R, 1] = +(E[r, c]); Y = E / S; }""",
        {"X": (7, 100)}),
    "transpose": ("function (A[M, N]) -> (B) { B[n, m : N, M] = =(A[m, n]); }", {"A": (13, 17)}),
    "product": ("function (A[M, N]) -> (P) { P[m : M] = *(A[m, n]); }", {"A": (9, 6)}),
    "max_reduce": ("function (A[M, N]) -> (P) { P[n : N] = >(A[m, n]); }", {"A": (31, 16)}),
    "min_reduce": ("function (A[M, N]) -> (P) { P[m : M] = <(A[m, n]); }", {"A": (16, 31)}),
    "assign_shift": ("function (A[N]) -> (B) { B[i : N] = =(A[i + 1]), i < N - 1 default A; }",
                     {"A": (21,)}),
    "scalar_sum": ("function (A[M, N]) -> (S) { S[] = +(A[m, n]); }", {"A": (12, 10)}),
    "trace": ("function (A[N, N]) -> (T, D) { T[] = +(A[i, i]); D[i : N] = =(A[i, i]); }",
              {"A": (11, 11)}),
    "broadcast": ("function (A[M, N], B[N], C[M, 1]) -> (O) { O = A * B + C; }",
                  {"A": (5, 8), "B": (8,), "C": (5, 1)}),
    "several_outputs": (
        """function (A[M, K], B[K, N]) -> (C, D, E) {
             C[m, n : M, N] = +(A[m, k] * B[k, n]); D = C * 2; E[m : M] = >(A[m, k]); }""",
        {"A": (6, 7), "B": (7, 9)}),
    "conv_bias_relu": (
        """function (I[N, X, Y, C], K[KX, KY, C, F], B[F]) -> (R) {
             O[n, x, y, f : N, X, Y, F] = +(I[n, x + i - 1, y + j - 1, c] * K[i, j, c, f]);
             R = relu(O + B); }""",
        {"I": (1, 8, 8, 8), "K": (3, 3, 8, 16), "B": (16,)}),
    # NCHW with the filter's output channels last (as the CPU relayout leaves it): the
    # channels are the vector lanes and the padded input is one element every lane shares.
    "conv_nchw_pad_bias_relu": (
        """function (I[N, CI, H, W], F[CI, KH, KW, CO], B[CO, U, V]) -> (R) {
             O[n, co, x0, x1 : N, CO, H, W] =
                 +(I[n, ci, x0 + k0 - 1, x1 + k1 - 1] * F[ci, k0, k1, co]);
             R = relu(O + B); }""",
        {"I": (1, 16, 9, 11), "F": (16, 3, 3, 24), "B": (24, 1, 1)}),
    "elementwise_chain": (
        """function (A[M, N], B[M, N]) -> (Z) {
             X = tanh(A) * sigmoid(B); Y = max(X, abs(A) - 0.5) + sqrt(abs(B));
             Z = Y > 0.2 ? exp(Y)
                         : log(abs(A) + 1.0) - floor(B * 3.0) / 3.0 + pow(abs(B), 1.5); }""",
        {"A": (9, 13), "B": (9, 13)}),
    "comb_add_max": ("function (A[M], B[N]) -> (O) { O[i, j : M, N] = >(A[i] + B[j]); }",
                     {"A": (7,), "B": (5,)}),
    "comb_eq_count": ("function (A[M], B[N]) -> (O) { O[i : M] = +(A[i] == B[j]); }",
                      {"A": (9,), "B": (4,)}),
    "argmax_cond": (
        """function (X[R, C], I[C]) -> (A) {
             M[r : R] = >(X[r, c]); A[r : R] = >(X[r, c] == M[r] ? I[c]); }""",
        {"X": (6, 10), "I": (10,)}),
    "triangular": ("function (A[N, N]) -> (O) { O[i : N] = +(A[i, j]), i - j < N; }",
                   {"A": (10, 10)}),
    "strided_output": ("function (A[N]) -> (O) { O[2 * i : 2 * N] = =(A[i]); }", {"A": (9,)}),
    "product_partial": ("function (A[N]) -> (O) { O[i : N] = *(A[i + j]), j < 3; }",
                        {"A": (8,)}),
    # Constraints on output indices alone: the elements they exclude are written zero.
    "out_constraint": ("function (A[N, M]) -> (O) { O[i, j : N, N] = +(A[i, j]), i + j < N; }",
                       {"A": (6, 7)}),
    "correlation": ("function (P[N], R[M]) -> (O) { O[i, j] = >(P[i] * R[i + j]); }",
                    {"P": (5,), "R": (8,)}),
    "opencl_names": (
        """function (float[M, N], half[N]) -> (local) {
             exp[kernel, int : M, N] = +(float[kernel, int] * half[int]);
             local = exp(exp) + float; }""",
        {"float": (4, 6), "half": (6,)}),
}

# Integer programs: inputs are small random integers.
INT_CASES = {
    "int_matmul": (MATMUL, {"A": (9, 13), "B": (13, 7)}),
    "int_bitwise": (
        """function (A[N], B[N]) -> (C, D) {
             C = ((A & B) | (A ^ 3)) + (A << 2) - (B >> 1);
             D = (A > B) && !(A == 0) || (B < -4); }""",
        {"A": (33,), "B": (33,)}),
}


# Transposed and strided-output convolutions: the reduce and defract rewrites (issue 9) ----------

def conv_transpose_nhwc(strides: tuple[int, ...], pads: tuple[int, ...] | None = None,
                        output_padding: tuple[int, ...] | None = None,
                        dilations: tuple[int, ...] | None = None) -> str:
    """Tile text of ONNX ConvTranspose (group 1) in NHWC, kernel laid out [K0.., CI, CO]:
    out[x] = sum over k, ci of in[(x + pad_begin - dilation * k) / stride] * w[k], at the points
    where that index is an integer.  `pads` is ONNX's (begins.., ends..).  Output size per
    dimension: (X - 1) * stride + dilation * (K - 1) + 1 - pad_begin - pad_end + output_padding.
    """
    r = len(strides)
    pads = pads or (0,) * (2 * r)
    output_padding = output_padding or (0,) * r
    dilations = dilations or (1,) * r
    xs, ks = [f"x{d}" for d in range(r)], [f"k{d}" for d in range(r)]
    sizes = [f"(X{d} - 1) * {strides[d]} + {dilations[d]} * (K{d} - 1) + 1 - {pads[d]} - "
             f"{pads[r + d]} + {output_padding[d]}" for d in range(r)]
    reads = [f"({xs[d]} + {pads[d]} - {dilations[d]} * {ks[d]}) / {strides[d]}"
             for d in range(r)]
    dims = ", ".join(f"X{d}" for d in range(r))
    kdims = ", ".join(f"K{d}" for d in range(r))
    return (f"function (I[N, {dims}, CI], K[{kdims}, CI, CO]) -> (O) {{\n"
            f"  O[n, {', '.join(xs)}, co : N, {', '.join(sizes)}, CO] =\n"
            f"      +(I[n, {', '.join(reads)}, ci] * K[{', '.join(ks)}, ci, co]);\n}}")


TRANSPOSED_CASES = {
    "convt1d_s2": (conv_transpose_nhwc((2,)), {"I": (2, 7, 3), "K": (3, 3, 4)}),
    "convt1d_s3_pad_outpad": (conv_transpose_nhwc((3,), (1, 2), (1,)),
                              {"I": (1, 6, 2), "K": (4, 2, 3)}),
    "convt2d_s2": (conv_transpose_nhwc((2, 2)), {"I": (1, 5, 4, 3), "K": (3, 3, 3, 4)}),
    "convt2d_s2_pad_outpad": (conv_transpose_nhwc((2, 2), (1, 1, 1, 1), (1, 1)),
                              {"I": (2, 4, 5, 3), "K": (3, 3, 3, 5)}),
    "convt2d_s3_pad_outpad": (conv_transpose_nhwc((3, 3), (1, 0, 2, 1), (2, 1)),
                              {"I": (1, 4, 3, 2), "K": (4, 3, 2, 3)}),
    "convt2d_s3x2_dilated": (conv_transpose_nhwc((3, 2), (0, 1, 0, 1), (0, 1), (2, 1)),
                             {"I": (1, 3, 4, 2), "K": (2, 3, 2, 3)}),
    # Kernel 4, stride 2, pad 1 doubles the size: a dense output, so bias and ReLU fuse.
    "convt2d_s2_bias_relu_fused": (
        """function (I[N, X, Y, CI], K[KX, KY, CI, CO], B[CO]) -> (R) {
             O[n, x, y, co : N, 2*X, 2*Y, CO] =
                 +(I[n, (x + 1 - i)/2, (y + 1 - j)/2, ci] * K[i, j, ci, co]);
             R = relu(O + B); }""",
        {"I": (1, 4, 3, 3), "K": (4, 4, 3, 4), "B": (4,)}),
    # The scatter form: each input pixel adds a kernel-sized patch (reduce, then defract).
    "convt2d_scatter_bias_relu": (
        """function (I[N, X, Y, CI], K[KX, KY, CI, CO], B[CO]) -> (R) {
             O[n, 2*x + i, 2*y + j, co : N, 2*X + 1, 2*Y + 1, CO] =
                 +(I[n, x, y, ci] * K[i, j, ci, co]);
             R = relu(O + B); }""",
        {"I": (1, 4, 3, 3), "K": (3, 3, 3, 4), "B": (4,)}),
    "repeat": ("function (I[N]) -> (O) { O[3 * n + k : 3 * N] = =(I[n]), k < 3; }",
               {"I": (7,)}),
    "repeat_no_defract": (
        "function (I[N]) -> (O) { O[3 * n + k : 3 * N] = =(I[n]), k < 3 no_defract; }",
        {"I": (7,)}),
    "upsample2d_nearest": (
        """function (I[N, X, Y, C]) -> (O) {
             O[n, 2*x + i, 3*y + j, c : N, 2*X, 3*Y, C] = =(I[n, x, y, c]), i < 2, j < 3; }""",
        {"I": (2, 3, 4, 5)}),
    "scatter_overlap_add": (
        "function (A[N, W]) -> (O) { O[2*i + j : 2*N + 2] = +(A[i, j]); }", {"A": (6, 4)}),
    "subpixel_conv": (
        """function (I[N, X, Y, C], K[KX, KY, C, F]) -> (O) {
             T[n, x, y, f : N, X, Y, F] = +(I[n, x + i - 1, y + j - 1, c] * K[i, j, c, f]);
             O[n, 2*x + a, 2*y + b, co : N, 2*X, 2*Y, 3] =
                 =(T[n, x, y, 6*a + 3*b + co]), a < 2, b < 2, co < 3; }""",
        {"I": (1, 4, 5, 3), "K": (3, 3, 3, 12)}),
    "output_fraction": (
        "function (I[X, C]) -> (O) { O[x / 2, c : X / 2, C] = >(I[x, c]); }", {"I": (9, 4)}),
}
CASES.update(TRANSPOSED_CASES)
