"""PyTorch SDPA beside `bench --suite` (issue 27's table): causal, 16 heads, batch 1, f16 and
bf16, forward and forward + backward, CUDA events (20 runs after 3). Run it on the device
in the same session as bench: `python3 runtime/scripts/torch_sdpa.py`."""
import torch, torch.nn.functional as F
def t(f, n=20):
    for _ in range(3): f()
    s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e)/n
print("torch", torch.__version__)
for (S, D) in [(4096,128),(8192,128),(16384,128),(4096,64),(4096,256)]:
    for dt in (torch.float16, torch.bfloat16):
        q=torch.randn(1,16,S,D,device='cuda',dtype=dt,requires_grad=True); k=torch.randn_like(q,requires_grad=True); v=torch.randn_like(q,requires_grad=True)
        fl=4*S*S*16*D/2
        try:
            f=lambda: F.scaled_dot_product_attention(q,k,v,is_causal=True)
            ms=t(f); o=f(); g=torch.randn_like(o)
            def fb():
                o=F.scaled_dot_product_attention(q,k,v,is_causal=True); o.backward(g)
            msb=t(fb)
            print(f"torch sdpa S={S} d={D} {str(dt)[6:]}: fwd {ms:.4f} ms {fl/ms/1e9:.0f} TF  fwd+bwd {msb:.4f} ms  bwd~{(msb-ms):.4f} ms {2.5*fl/(msb-ms)/1e9:.0f} TF")
        except Exception as ex:
            print(f"torch S={S} d={D} {dt}: {ex}"[:200])
# Decode: one query row per head against a 32k cache, 32 query heads over 8 KV heads, d128.
for dt in (torch.float16, torch.bfloat16):
    L=32768; q=torch.randn(1,32,1,128,device='cuda',dtype=dt)
    k=torch.randn(1,8,L,128,device='cuda',dtype=dt); v=torch.randn_like(k)
    ms=t(lambda: F.scaled_dot_product_attention(q,k,v,enable_gqa=True), 50)
    gb=2*k.numel()*k.element_size()/1e9
    print(f"torch decode L={L} 32/8/128 {str(dt)[6:]}: {ms:.4f} ms {gb/ms*1e3:.0f} GB/s")
x=torch.empty(256*1024*1024//4, device='cuda'); y=torch.empty_like(x)
ms=t(lambda: y.copy_(x), 20); print(f"torch copy 256 MiB: {ms:.4f} ms {2*x.numel()*4/ms/1e6:.0f} GB/s")
# LayerNorm + Linear, [8192, 768] -> 3072.
for dt in (torch.float32, torch.float16, torch.bfloat16):
    ln=torch.nn.LayerNorm(768,device='cuda',dtype=dt); lin=torch.nn.Linear(768,3072,device='cuda',dtype=dt)
    x=torch.randn(8192,768,device='cuda',dtype=dt,requires_grad=True)
    with torch.no_grad(): ms=t(lambda: lin(ln(x)))
    g=torch.randn(8192,3072,device='cuda',dtype=dt)
    msb=t(lambda: lin(ln(x)).backward(g))
    print(f"torch layernorm+linear [8192,768]->3072 {str(dt)[6:]}: fwd {ms:.4f} ms  fwd+bwd {msb:.4f} ms")
