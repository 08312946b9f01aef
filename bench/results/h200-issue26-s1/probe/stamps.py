import os, time
_f = None
def mark(tag):
    global _f
    if _f is None:
        d = os.environ.get("STAMPS_DIR", "/tmp/prof")
        os.makedirs(d, exist_ok=True)
        _f = open(f"{d}/stamps.{os.getpid()}", "a", buffering=1)
    _f.write(f"{tag} {time.perf_counter():.7f}\n")
