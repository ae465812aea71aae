"""Worked solutions to the exercises of notebook 08 (speed-ups)."""


def linear_flops(tokens, d_in, d_out):
    # Z = X W^T: (tokens, d_in) @ (d_in, d_out); dX = dZ W: (tokens, d_out) @ (d_out, d_in);
    # dW = dZ^T X: (d_out, tokens) @ (tokens, d_in). Each is tokens * d_in * d_out multiply-adds.
    macs = tokens * d_in * d_out
    return {"forward": 2 * macs, "grad_input": 2 * macs, "grad_weight": 2 * macs}


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def step_speedup(parts):
    # Amdahl: only the time changes, part by part; the step's speed-up is old time / new time.
    old = sum(ms for ms, _ in parts)
    new = sum(ms / speedup for ms, speedup in parts)
    return old / new
