# Issue 29 item 1: PyTorch SDPA with MLA's widths (Q/K 192, V 128) beside one width, on a CUDA GPU:
# the forward, the backward (forward + backward less the forward) and the decode, as
# docs/performance.md reports them. Run: python3 runtime/scripts/mla_sdpa.py
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
def t(f, n=30):
    for _ in range(5): f()
    s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); s.record()
    for _ in range(n): f()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e)/n
print("torch", torch.__version__, torch.cuda.get_device_name())
S, H = 4096, 16
for dt in (torch.float16, torch.bfloat16):
    for (D, DV) in [(192,128),(192,192),(128,128)]:
        q=torch.randn(1,H,S,D,device='cuda',dtype=dt); k=torch.randn_like(q); v=torch.randn(1,H,S,DV,device='cuda',dtype=dt)
        fl=2*S*S*H*(D+DV)/2
        for name, be in [("default", None), ("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]:
            try:
                if be is None:
                    f=lambda: F.scaled_dot_product_attention(q,k,v,is_causal=True)
                    ms=t(f)
                else:
                    with sdpa_kernel(be):
                        f=lambda: F.scaled_dot_product_attention(q,k,v,is_causal=True)
                        ms=t(f)
                print(f"torch sdpa {name:9s} S={S} d={D} dv={DV} {str(dt)[6:]}: fwd {ms:.4f} ms {fl/ms/1e9:.0f} TF")
            except Exception as ex:
                print(f"torch sdpa {name:9s} S={S} d={D} dv={DV} {str(dt)[6:]}: unavailable ({str(ex).splitlines()[0][:80]})")
S, H = 4096, 16
for dt in (torch.float16, torch.bfloat16):
    for (D, DV) in [(192,128),(192,192),(128,128)]:
        q=torch.randn(1,H,S,D,device='cuda',dtype=dt,requires_grad=True); k=torch.randn(1,H,S,D,device='cuda',dtype=dt,requires_grad=True)
        v=torch.randn(1,H,S,DV,device='cuda',dtype=dt,requires_grad=True)
        go=torch.randn(1,H,S,DV,device='cuda',dtype=dt)
        fwd=t(lambda: F.scaled_dot_product_attention(q,k,v,is_causal=True), 20)
        def both():
            o=F.scaled_dot_product_attention(q,k,v,is_causal=True); o.backward(go)
        fb=t(both, 20)
        fl=2*S*S*H*(3*D+2*DV)/2
        print(f"torch sdpa S={S} d={D} dv={DV} {str(dt)[6:]}: fwd {fwd:.4f} ms, fwd+bwd {fb:.4f} ms, bwd {fb-fwd:.4f} ms {fl/(fb-fwd)/1e9:.0f} TF")
L, H, KV = 32768, 32, 8
for dt in (torch.float16,):
    for (D, DV) in [(192,128),(128,128)]:
        q=torch.randn(1,H,1,D,device='cuda',dtype=dt)
        k=torch.randn(1,KV,L,D,device='cuda',dtype=dt); v=torch.randn(1,KV,L,DV,device='cuda',dtype=dt)
        by=2*(KV*L*(D+DV)+H*(D+DV))
        ms=t(lambda: F.scaled_dot_product_attention(q,k,v,enable_gqa=True), 50)
        print(f"torch sdpa decode cache={L} {H}/{KV} d={D}/{DV} f16: {ms:.4f} ms {by/ms/1e6:.0f} GB/s")
