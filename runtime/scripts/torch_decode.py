"""PyTorch beside `bench --decode` and `bench --e2e` on the same shapes, in the same device
command: decode (one query row per head against a cache), n new rows over a cache (causal
among them, offset by the cache: `causal_lower_right`), and F.linear at decode's row counts.
CUDA events, the median of 50 runs after 5. Run it on the device in the same command as
bench: `python3 runtime/scripts/torch_decode.py [--quick] [--continue | --linear | --cascade
PREFIX]`; --cascade: the decode of n = 4, 16, 64 sequences over PREFIX + 512 rows each, the
work `bench --decode PREFIX --cascade` does (torch reads the prefix once per sequence);
--step [CACHE]: a `decode-loop` step of 2 sequences at 32/8/128 in f16 (LayerNorm, Q, K and
V in one F.linear, RoPE, the append, SDPA over CACHE rows (640 unless given), the O
F.linear), eager and replayed as a CUDA graph."""
import sys, statistics, torch, torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

def t(f, n=50):
    for _ in range(5): f()
    times = []
    for _ in range(n):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); f(); e.record(); torch.cuda.synchronize(); times.append(s.elapsed_time(e))
    return statistics.median(times)

quick = "--quick" in sys.argv
# --continue: only the continued caches (n rows over a cache) and the fresh forward.
only_continue = "--continue" in sys.argv
# --linear: only the projections.
only_linear = "--linear" in sys.argv
# --cascade PREFIX: only the decode of the cascade's work.
cascade = int(sys.argv[sys.argv.index("--cascade") + 1]) if "--cascade" in sys.argv else None
print("torch", torch.__version__, torch.cuda.get_device_name())
x = torch.empty(256 * 1024 * 1024 // 4, device='cuda'); y = torch.empty_like(x)
ms = t(lambda: y.copy_(x)); print(f"torch copy 256 MiB: {ms:.4f} ms {2 * x.numel() * 4 / ms / 1e6:.0f} GB/s")
del x, y

def decode(B, L, H, KV, D, dt):
    q = torch.randn(B, H, 1, D, device='cuda', dtype=dt)
    k = torch.randn(B, KV, L, D, device='cuda', dtype=dt); v = torch.randn_like(k)
    ms = t(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    gb = (2 * k.numel() + 2 * q.numel()) * k.element_size() / 1e9
    print(f"torch decode b={B} cache={L} {H}/{KV}/{D} {str(dt)[6:]}: {ms:.4f} ms {gb / ms * 1e3:.0f} GB/s")

def decode_step(B, L, H, KV, D, dt):
    hid, kvw = H * D, KV * D
    x = torch.randn(B, hid, device='cuda')
    wqkv = torch.randn(hid + 2 * kvw, hid, device='cuda', dtype=dt) * hid ** -0.5
    wo = torch.randn(hid, hid, device='cuda', dtype=dt) * hid ** -0.5
    bqkv = torch.zeros(hid + 2 * kvw, device='cuda', dtype=dt)
    bo = torch.zeros(hid, device='cuda', dtype=dt)
    kc = torch.randn(B, KV, L, D, device='cuda', dtype=dt); vc = torch.randn_like(kc)
    ang = (L - 1) / 10000 ** (torch.arange(0, D, 2, device='cuda') / D)
    cos, sin = ang.cos().to(dt), ang.sin().to(dt)
    def rope(t):
        a, b = t[..., : D // 2], t[..., D // 2 :]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)
    def f():
        xn = F.layer_norm(x, (hid,)).to(dt)
        q, k, v = F.linear(xn, wqkv, bqkv).split([hid, kvw, kvw], -1)
        q, k = rope(q.view(B, H, 1, D)), rope(k.view(B, KV, 1, D))
        kc[:, :, L - 1 :] = k; vc[:, :, L - 1 :] = v.view(B, KV, 1, D)
        o = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
        return F.linear(o.reshape(B, hid), wo, bo).float()
    eager = t(f)
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): f()
    graph = t(g.replay)
    print(f"torch decode step b={B} cache={L} {H}/{KV}/{D} {str(dt)[6:]}: eager {eager:.4f} ms, "
          f"CUDA graph {graph:.4f} ms")

if "--step" in sys.argv:
    at = sys.argv.index("--step") + 1
    L = int(sys.argv[at]) if at < len(sys.argv) and sys.argv[at].isdigit() else 640
    decode_step(2, L, 32, 8, 128, torch.float16)
    sys.exit(0)

if cascade is not None:
    for n in (4, 16, 64):
        decode(n, cascade + 512, 32, 8, 128, torch.float16)
    sys.exit(0)

lens = [32768] if quick else [32768, 65536, 131072]
for dt in () if only_continue or only_linear else (torch.float16, torch.bfloat16):
    for (H, KV, D) in [(32, 8, 128), (64, 8, 128), (32, 8, 64)]:
        for L in lens:
            for B in (1, 8):
                decode(B, L, H, KV, D, dt)

# n new rows per sequence over a cache of L rows (L includes them): chunked prefill, the
# next turn of a chat, speculative verification.
for dt in () if only_linear else (torch.float16,):
    runs = [(1, 32, n) for n in (1, 4, 8, 16, 32, 64, 128, 512)]
    runs += [(B, H, n) for (B, H) in [(8, 32), (1, 64)] for n in (4, 16)]
    for (B, H, n) in runs:
        L = 32768; KV, D = 8, 128
        q = torch.randn(B, H, n, D, device='cuda', dtype=dt)
        k = torch.randn(B, KV, L, D, device='cuda', dtype=dt); v = torch.randn_like(k)
        mask = causal_lower_right(n, L)
        ms = t(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
        gb = 2 * k.numel() * k.element_size() / 1e9
        fl = 4 * B * n * L * H * D
        print(f"torch continue b={B} n={n} cache={L} {H}/{KV}/{D} {str(dt)[6:]}: {ms:.4f} ms "
              f"{gb / ms * 1e3:.0f} GB/s {fl / ms / 1e9:.1f} TFLOP/s")
    # A fresh prompt's causal forward on the same heads: the chunk's TFLOP/s beside it.
    S = 4096
    q = torch.randn(1, H, S, D, device='cuda', dtype=dt)
    k = torch.randn(1, KV, S, D, device='cuda', dtype=dt); v = torch.randn_like(k)
    ms = t(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    fl = 2 * S * (S + 1) * H * D
    print(f"torch forward causal {S} {H}/{KV}/{D} {str(dt)[6:]}: {ms:.4f} ms {fl / ms / 1e9:.1f} TFLOP/s")

# Projections at decode shapes: F.linear of [rows, 768] by [3072, 768], 4096 x 4096, a
# fused Q, K and V of 32/8 heads of 128 (4096 -> 6144) and an MLP's 4096 -> 14336.
for dt in () if only_continue else (torch.float32, torch.float16, torch.bfloat16):
    for (K, N) in [(768, 3072), (4096, 4096), (4096, 6144), (4096, 14336)]:
        w = torch.randn(N, K, device='cuda', dtype=dt)
        for rows in (1, 2, 8, 16):
            a = torch.randn(rows, K, device='cuda', dtype=dt)
            ms = t(lambda: F.linear(a, w))
            gb = w.numel() * w.element_size() / 1e9
            print(f"torch linear rows={rows} {K}->{N} {str(dt)[6:]}: {ms:.4f} ms {gb / ms * 1e3:.0f} GB/s of weights")
