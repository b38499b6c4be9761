"""PyTorch SDPA on one GPU beside `context-parallel`: the same sequence (batch 1, causal,
f16), forward and forward + backward, CUDA events (5 runs after 2). Run it in the same
device command as the example: `python3 examples/context-parallel/torch_sdpa.py 32768 65536`
(heads, KV heads and head_dim: --heads 16 --head-dim 128, the example's flags)."""
import argparse, torch, torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("seq", type=int, nargs="+")
ap.add_argument("--heads", type=int, default=16)
ap.add_argument("--head-dim", type=int, default=128)
a = ap.parse_args()

def t(f, n=5):
    for _ in range(2): f()
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / n

print("torch", torch.__version__, torch.cuda.get_device_name(0), "GPUs:", torch.cuda.device_count())
for S in a.seq:
    q = torch.randn(1, a.heads, S, a.head_dim, device="cuda", dtype=torch.float16, requires_grad=True)
    k = torch.randn_like(q, requires_grad=True); v = torch.randn_like(q, requires_grad=True)
    f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    fwd = t(f); g = torch.randn_like(f())
    def fb():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
    both = t(fb)
    print(f"torch sdpa S={S} h={a.heads} d={a.head_dim} f16 causal: fwd {fwd:.3f} ms  bwd {both - fwd:.3f} ms  fwd+bwd {both:.3f} ms")
