"""``python -m benchmarks ffn``: how fast 2:4 FFNs train on cuSPARSELt (and CUTLASS), against dense and PyTorch's path.

The speed benchmark: one command, one GPU, everything side by side in one run, bf16. Each time is
the median of ``--reps`` calls after ``--warmup`` calls (the warm-up holds the algorithm search,
the Triton compiles and the allocations), each call between two CUDA events, the calls back to
back (host and GPU pipelined as in training), ``torch.cuda.synchronize()`` before and after.

0. Before anything heats the GPU: the six products of the target shape's dense step as bare matmuls
   (the start-of-run matmul rate), one matmul, and the dense step alone (``baseline``); the products
   again at the end. The GPU's clocks, power and temperature are sampled through the whole run, per
   section (``conditions``; ``benchmarks/conditions.py``).
1. FFN block ``y = W2 gelu(W1 x)``, W1 (ffn, d), W2 (d, ffn), ffn = 4 d, no bias, x (tokens, d),
   for tokens in {4096, 16384} x d_model in {1024, 2048, 4096, 8192}. Phase "fwd_bwd": one training
   step (grads cleared, forward, ``y.backward(dy)`` for dx, dW1, dW2); phase "fwd": the forward
   alone under ``torch.no_grad()``. Variants (a fixed schema, read by the notebooks):

   dense                    nn.Linear, bf16 weights and inputs
   ours_fixed_mask          STE, transposable 2:4, backend "cusparselt", mask never refreshed; the
                            masked weight is still pruned and compressed again every step (in
                            training the weight changes every step)
   ours_mask_every_step     STE, transposable, mask recomputed every step
   ours_mvue                S-STE + MVUE weight gradient (all three products sparse), mask every step
   cutlass_mvue             the same on backend "cutlass" (CUTLASS's SM90 sparse GEMMs, Hopper only); where CUTLASS
                            cannot run its rows are "skipped" with the reason (``unavailable``), never dropped
   ours_mvue_refresh40      the same, mask recomputed every 40 steps (Hu et al. 2024's setting), timed
                            as the mean over whole 40-step cycles
   ours_mvue_dense_products the same method on backend "triton": the same masks, soft threshold and MVUE
                            (Triton kernels), every product dense: what ``auto`` must never lose to
   pytorch_semi_structured  ``to_sparse_semi_structured(masked W)`` + ``F.linear``: weights fixed,
                            compressed once; backward as autograd gives it (input gradient only)
   auto                     ours_mvue on "cusparselt_auto" (each product sparse only where measured faster)
   sparse_auto              ours_mvue on "sparse_auto" (each product dense, on cuSPARSELt or on CUTLASS, as measured)

   Our step is what training runs: grads cleared, forward, backward, then ``advance_step(model)``,
   which is exactly what ``attach_optimizer``'s post-hook does after ``optimizer.step()`` (the next
   forward prunes and compresses again; the mask is recomputed when due). The optimizer's update
   itself is left out: dense would pay it too, and the GPT step below includes AdamW.
1b. Paired rounds at every grid shape: dense and the PAIRED variants built side by side, timed in
   turns, the speed-up taken per round; at the target shape each turn starts after ``--idle-s`` of idle
   GPU (``paired.py``).
2. Eager against CUDA-graph replay of one fwd_bwd step, dense, ours_mvue, its dense products and auto,
   at every grid shape (the per-call host cost of ``_cslt_sparse_mm``, measured per product by
   ``python -m benchmarks cslt-calls``: ``results/cusparselt_calls_h100.json``, ``host_overhead_ms``).
3. A GPT training step (``sparsity_lab.lab.model.GPT``, AdamW step included, bf16 autocast, fp32
   master weights; FFN linears 2:4 through ``sparsify``, and in ``ours_mvue_all_linears`` the attention
   projections too): tokens/s against dense, alone and in paired rounds.

At the target shape ``library_comparison`` puts ours_mvue and cutlass_mvue side by side, each against the
fastest dense of the run with its TFLOP/s (the headline rule below), and the two against each other per
paired round (printed after the table). A CUTLASS backend builds its library on first use (once per machine,
cached): the run asks for it before its clock starts (``library_setup_s``).

The targets (``targets.THRESHOLDS``) are judged from the measured rows (``targets.judge_targets``) and
printed last: each headline uses the fastest dense time of the run, the paired ratio beside it, and a
dense baseline below 90 % of the start-of-run rate of its products is flagged, not counted
(``results/ffn_baseline_NOTES.md`` says why). Modules: ``schema`` (the results format the readers
share), ``settings``, ``variants``, ``measure``, ``paired``, ``graph``, ``gpt``, ``baseline``, ``targets``,
``report``, ``cli``.
``--budget-s``: no new shape (or section) starts after that many seconds; what is left is listed in
``skipped``. Every measurement runs in its own try/except: an error is recorded (``errors``, and on
its row) and the run goes on.

``--smoke``: the plumbing on the CPU, tiny shapes, backend "torch" in place of cuSPARSELt (written to
``cusparselt_ffn_smoke.json`` with ``"smoke": true``). Its numbers are not figures.
"""
