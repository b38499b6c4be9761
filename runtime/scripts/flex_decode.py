"""FlexAttention's decode beside SDPA's on the shape of `bench --flex`'s decode rows: one
query row per head (32 over 8 KV heads, head_dim 128, f16) against a 32768-row cache, with
a window of 256 keys (and 4 sink keys) as a BlockMask at the query's position. CUDA events,
median of 20 after 5 warm-up calls. Run on the device machine: python3 flex_decode.py"""
import torch
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
torch.manual_seed(0)
S, H, KV, D = 32768, 32, 8, 128
q = torch.randn(1, H, 1, D, device="cuda", dtype=torch.float16)
k, v = (torch.randn(1, KV, S, D, device="cuda", dtype=torch.float16) for _ in range(2))
def timed(f, n=20):
    for _ in range(5): f()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        e0.record(); f(); e1.record(); torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1))
    ts.sort(); return ts[len(ts)//2]
print("sdpa decode dense", timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)))
try:
    fa = torch.compile(flex_attention)
    P = S - 1
    def win(b, h, qi, ki): return (ki <= qi + P) & ((qi + P - ki < 256) | (ki < 4))
    def swa(b, h, qi, ki): return (ki <= qi + P) & (qi + P - ki < 256)
    for name, m in [("window256+4sinks", win), ("window256", swa)]:
        bm = create_block_mask(m, 1, 1, 1, S)
        print("flex decode", name, timed(lambda: fa(q, k, v, block_mask=bm, enable_gqa=True)))
    print("flex decode dense", timed(lambda: fa(q, k, v, enable_gqa=True)))
except Exception as e:
    print("flex decode unavailable:", repr(e)[:300])
