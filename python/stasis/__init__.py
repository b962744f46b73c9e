"""Application-level checkpointing with libstasis.

A thin ctypes binding over the C library (``libstasis.so``): no compiler
is needed to install it, only the library. It is found through the
``STASIS_LIB`` environment variable (a path to ``libstasis.so``), else the
dynamic linker's usual search (``ldconfig``, ``LD_LIBRARY_PATH``).

    import numpy as np, stasis
    a = np.zeros(1 << 20)
    with stasis.session("/tmp/ckpt", monitor="acck") as s:
        s.protect(0, a)
        v = s.restart_test("run")
        if v is not None:
            s.restart("run", v)
        ...
        s.checkpoint("run", it)

Errors raise :class:`StasisError` (its ``code`` is the C code).
"""

import ctypes
import ctypes.util
import os

__all__ = [
    "StasisError", "init", "protect", "unprotect", "checkpoint", "checkpoint_begin",
    "checkpoint_wait", "restart_test", "restart", "stats", "request_checkpoint",
    "finalize", "session", "MONITORS", "RESTORED", "ERR_NOT_UNDER_RUN",
    "ERR_CHECKPOINT_FAILED",
]

MONITORS = {"auto": 1, "full": 2, "page": 3, "acck": 4, "uffd": 5}
_TARGETS = {"dir": 1, "pmem": 2}
_NONE = -1


class _Config(ctypes.Structure):
    _fields_ = [
        ("monitor", ctypes.c_int), ("target", ctypes.c_int), ("max_versions", ctypes.c_int),
        ("acck_n", ctypes.c_int), ("acck_hot_percent", ctypes.c_int),
        ("acck_window_percent", ctypes.c_int), ("huge_pages", ctypes.c_int),
        ("pmem_latency_ns", ctypes.c_uint64),
    ]


class _Stats(ctypes.Structure):
    _fields_ = [("monitor", ctypes.c_int)] + [
        (n, ctypes.c_uint64) for n in (
            "checkpoints", "faults", "pieces_released", "pages_released", "huge_collapsed",
            "huge_failed", "bytes_copied", "bytes_written", "monitor_ns", "copy_ns", "write_ns",
            "cow_copies")
    ]


class StasisError(Exception):
    """A libstasis call failed; ``code`` is the C error code."""

    def __init__(self, code, message):
        super().__init__(f"{message} (code {code})")
        self.code = code


def _load():
    path = os.environ.get("STASIS_LIB") or ctypes.util.find_library("stasis") or "libstasis.so"
    lib = ctypes.CDLL(path)
    c = ctypes.c_char_p
    sig = {
        "stasis_init": ([c, ctypes.POINTER(_Config)], ctypes.c_int),
        "stasis_protect": ([ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t], ctypes.c_int),
        "stasis_unprotect": ([ctypes.c_int], ctypes.c_int),
        "stasis_checkpoint": ([c, ctypes.c_int], ctypes.c_int),
        "stasis_checkpoint_begin": ([c, ctypes.c_int], ctypes.c_int),
        "stasis_checkpoint_wait": ([], ctypes.c_int),
        "stasis_restart_test": ([c], ctypes.c_int),
        "stasis_restart": ([c, ctypes.c_int], ctypes.c_int),
        "stasis_stats": ([ctypes.POINTER(_Stats)], ctypes.c_int),
        "stasis_request_checkpoint": ([], ctypes.c_int),
        "stasis_finalize": ([], ctypes.c_int),
        "stasis_strerror": ([ctypes.c_int], c),
        "stasis_last_error": ([], c),
    }
    for name, (args, res) in sig.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    return lib


_lib = None
_keep = {}  # region id -> the object whose memory is protected (kept alive)


def _l():
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


def _check(rc):
    if rc < 0 and rc != _NONE:
        raise StasisError(rc, (_l().stasis_last_error() or b"").decode(errors="replace"))
    return rc


def _address(obj):
    """(address, length) of a writable, contiguous buffer or NumPy array."""
    iface = getattr(obj, "__array_interface__", None)
    if iface is not None:
        addr, readonly = iface["data"]
        if readonly:
            raise ValueError("the array is read-only")
        if not (obj.flags["C_CONTIGUOUS"] or obj.flags["F_CONTIGUOUS"]):
            raise ValueError("the array is not contiguous")
        return addr, obj.nbytes
    mv = memoryview(obj)
    if mv.readonly:
        raise ValueError("the buffer is read-only")
    if not mv.contiguous:
        raise ValueError("the buffer is not contiguous")
    n = mv.nbytes
    return ctypes.addressof((ctypes.c_char * n).from_buffer(mv)), n


def init(directory, monitor=None, target=None, max_versions=0, acck_n=0,
         huge_pages=None, pmem_latency_ns=0):
    """Starts the library; checkpoints go to ``directory``."""
    cfg = _Config()
    if monitor is not None:
        cfg.monitor = MONITORS[monitor]
    if target is not None:
        cfg.target = _TARGETS[target]
    cfg.max_versions, cfg.acck_n, cfg.pmem_latency_ns = max_versions, acck_n, pmem_latency_ns
    if huge_pages is not None:
        cfg.huge_pages = 1 if huge_pages else -1
    _check(_l().stasis_init(os.fsencode(directory), ctypes.byref(cfg)))


def protect(region_id, obj):
    """Protects a NumPy array or any writable contiguous buffer (bytearray,
    array.array, mmap...). The object is kept alive until unprotect."""
    addr, n = _address(obj)
    _check(_l().stasis_protect(region_id, addr, n))
    _keep[region_id] = obj


def unprotect(region_id):
    _check(_l().stasis_unprotect(region_id))
    _keep.pop(region_id, None)


def checkpoint(name, version):
    _check(_l().stasis_checkpoint(name.encode(), version))


def checkpoint_begin(name, version):
    _check(_l().stasis_checkpoint_begin(name.encode(), version))


def checkpoint_wait():
    _check(_l().stasis_checkpoint_wait())


def restart_test(name):
    """The newest complete version of ``name``, or None."""
    v = _check(_l().stasis_restart_test(name.encode()))
    return None if v == _NONE else v


def restart(name, version):
    _check(_l().stasis_restart(name.encode(), version))


def stats():
    s = _Stats()
    _check(_l().stasis_stats(ctypes.byref(s)))
    out = {n: getattr(s, n) for n, _ in _Stats._fields_}
    out["monitor"] = {v: k for k, v in MONITORS.items()}.get(s.monitor, s.monitor)
    return out


RESTORED = 1
ERR_NOT_UNDER_RUN = -13
ERR_CHECKPOINT_FAILED = -15


def request_checkpoint():
    """Ask the surrounding ``stasis run`` for a transparent checkpoint now
    and wait until it is committed. Returns False, or True when the program
    was restored from that very checkpoint and goes on from here. Raises
    StasisError (code ERR_NOT_UNDER_RUN outside ``stasis run``,
    ERR_CHECKPOINT_FAILED when the checkpoint failed)."""
    return _check(_l().stasis_request_checkpoint()) == RESTORED


def finalize():
    _check(_l().stasis_finalize())
    _keep.clear()


class session:
    """``with stasis.session(dir, **config) as s:`` init on entry, finalize
    on exit (also when the block raises)."""

    def __init__(self, directory, **config):
        self.directory, self.config = directory, config

    def __enter__(self):
        init(self.directory, **self.config)
        return _Session()

    def __exit__(self, *exc):
        finalize()
        return False


class _Session:
    protect = staticmethod(protect)
    unprotect = staticmethod(unprotect)
    checkpoint = staticmethod(checkpoint)
    checkpoint_begin = staticmethod(checkpoint_begin)
    checkpoint_wait = staticmethod(checkpoint_wait)
    restart_test = staticmethod(restart_test)
    restart = staticmethod(restart)
    stats = staticmethod(stats)
