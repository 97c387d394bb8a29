"""mtpx's CPU kernels: C sources built on first use with the system C compiler and loaded with
ctypes (`build.load`). Each has a torch reference beside it, which runs without a compiler:
paged_attention.c (mtpx.attention.cpu_kernel; reference torch_backend.cached_attention) and
gdn_decode.c (mtpx.models.gdn_kernel; reference GatedDeltaNet.forward's torch ops)."""
