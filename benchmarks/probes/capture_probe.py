"""Which releases are legal while another thread captures a graph (global mode)?"""
import threading, ctypes
import numpy as np
import cupy as cp
from cupy.cuda import runtime
from cupy_swap.cuda import release

def attempt(name, fn):
    s = cp.cuda.Stream(non_blocking=True)
    a = cp.zeros(16, cp.float32)
    cp.cuda.Device().synchronize()
    result = {}
    started, finished = threading.Event(), threading.Event()
    def other():
        release._exchange_capture_mode(2)  # relaxed, as the releaser
        started.wait()
        try:
            fn()
            result["call"] = "ok"
        except Exception as e:
            result["call"] = repr(e)[:120]
        finished.set()
    t = threading.Thread(target=other); t.start()
    s.begin_capture()  # CuPy default mode
    with s:
        a += 1
    started.set(); finished.wait(20)
    try:
        g = s.end_capture()
        g.launch(s); s.synchronize()
        result["capture"] = "ok" if float(a[0]) == 1.0 else f"bad value {float(a[0])}"
    except Exception as e:
        result["capture"] = repr(e)[:120]
    t.join()
    print(f"{name:28s} call={result.get('call')}  capture={result.get('capture')}", flush=True)

def pinned():
    return runtime.hostAlloc(1 << 20, 3)

p1 = pinned(); attempt("cudaFreeHost", lambda: runtime.freeHost(p1))
buf = np.zeros(1 << 20, np.uint8); runtime.hostRegister(buf.ctypes.data, buf.nbytes, 3)
attempt("cudaHostUnregister", lambda: runtime.hostUnregister(buf.ctypes.data))
d1 = runtime.malloc(1 << 20); attempt("cudaFree", lambda: runtime.free(d1))
attempt("cudaDeviceSynchronize", runtime.deviceSynchronize)
ev = cp.cuda.Event(); ev.record(cp.cuda.Stream(non_blocking=True))
attempt("cudaEventSynchronize", ev.synchronize)
attempt("cudaMalloc", lambda: runtime.free(runtime.malloc(1 << 20)))
# and on the capturing thread itself, in relaxed mode
s = cp.cuda.Stream(non_blocking=True); a = cp.zeros(4, cp.float32); cp.cuda.Device().synchronize()
s.begin_capture()
with s:
    a += 1
try:
    with release.relaxed_capture_mode():
        p = runtime.hostAlloc(4096, 3); d = runtime.malloc(4096)
        st = runtime.streamCreateWithFlags(1); runtime.memsetAsync(d, 0, 4096, st); runtime.streamSynchronize(st); runtime.streamDestroy(st)
    r = "ok"
except Exception as e:
    r = repr(e)[:120]
try:
    g = s.end_capture(); g.launch(s); s.synchronize(); c = "ok" if float(a[0]) == 1 else "bad"
except Exception as e:
    c = repr(e)[:120]
print(f"{'same-thread alloc+memset':28s} call={r}  capture={c}")
