"""Worked solutions to the exercises of notebook 08 (speed-ups)."""


def linear_flops(tokens, d_in, d_out):
    # Z = X W^T: (tokens, d_in) @ (d_in, d_out); dX = dZ W: (tokens, d_out) @ (d_out, d_in);
    # dW = dZ^T X: (d_out, tokens) @ (tokens, d_in). Each is tokens * d_in * d_out multiply-adds.
    macs = tokens * d_in * d_out
    return {"forward": 2 * macs, "grad_input": 2 * macs, "grad_weight": 2 * macs}


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def step_speedup(f, s):
    # Amdahl: a dense step of 1 is f in the products and 1 - f in the rest. The products then take f / s,
    # the rest as before; the step's speed-up is old time / new time.
    return 1 / ((1 - f) + f / s)


def intensity(m, k, n, sparse):
    # bf16: 2 bytes a value. A 2:4 weight keeps m*k/2 values and 2 bits (1/4 byte) of metadata per kept
    # value: 9/16 of its dense bytes. The dense operand B (k, n) and the output (m, n) move in full.
    weight = (m * k // 2) * 2 + (m * k // 2) // 4 if sparse else 2 * m * k
    return 2 * m * k * n / (weight + 2 * k * n + 2 * m * n)
