"""The audit-hook prelude each ``<python>`` tool process runs before the model's code.

Defence in depth and clearer errors ("sandbox: os.fork is not allowed"), not the boundary: the
hook lives in the interpreter it watches, so tool code can get past it (patching
``posixpath.abspath`` defeats its path checks, for one). The boundary is the kernel's
(:mod:`core.sandbox.kernel`). The prelude reads the source from stdin, installs a PEP 578
audit hook that raises PermissionError on: non-AF_UNIX sockets, DNS lookups, unix sockets
outside the workdir; writes/creates/renames/deletes/chmods outside the workdir; opening
directories or other processes' ``/proc/<pid>`` files outside it; fork, exec, subprocess,
os.system, posix_spawn, kill; ctypes, sub-interpreters, shared memory, setrlimit, gc
introspection; then runs the source as ``__main__``. Keep it stdlib-only.
"""

PRELUDE = r"""
import linecache, os, posix, resource, socket, stat, sys, traceback, types, _posixsubprocess
DENY = {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
        "subprocess.Popen", "os.kill", "os.killpg", "os.symlink", "resource.setrlimit",
        "resource.prlimit", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function", "socket.getaddrinfo",
        "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
        "socket.sethostname", "sqlite3.enable_load_extension", "sqlite3.load_extension"}
NO_IMPORT = {"_ctypes", "_posixsubprocess", "_posixshmem", "_xxsubinterpreters", "_testcapi",
             "_testinternalcapi", "_ctypes_test", "_xxtestfuzz"}
# event -> (index of a path argument, index of its dir_fd argument or None), ...
PATHS = {"os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),),
         "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)), "os.chmod": ((0, 2),),
         "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.truncate": ((0, None),),
         "os.setxattr": ((0, None),), "os.removexattr": ((0, None),), "shutil.rmtree": ((0, 1),)}
ADDRESS = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}

def make_hook(root, pid):  # helpers bound now: rebinding os.path.realpath etc. later has no effect
    realpath, join, fsdecode, getcwd, readlink = os.path.realpath, os.path.join, os.fsdecode, posix.getcwd, posix.readlink
    stat_, isdir, wflags = posix.stat, stat.S_ISDIR, os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    def resolve(path, dir_fd=None):
        if isinstance(path, int):
            return readlink(f"/proc/self/fd/{path}")
        base = readlink(f"/proc/self/fd/{dir_fd}") if isinstance(dir_fd, int) and dir_fd >= 0 else getcwd()
        return realpath(join(base, fsdecode(path)))
    def inside(path, dir_fd=None):
        p = resolve(path, dir_fd)
        return p == root or p.startswith(root + "/")
    def readable(path):  # not other processes' /proc entries, no directory fds outside root
        p = resolve(path)
        parts = p.split("/")
        if len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != pid:
            return False
        try:
            return inside(p) or not isdir(stat_(p).st_mode)
        except OSError:
            return True
    def allowed(event, args):
        if event == "open":
            path, mode, flags = args
            write = (isinstance(mode, str) and not set(mode).isdisjoint("wax+")) or flags & wflags
            if isinstance(path, int):
                return True
            return (inside(path) or resolve(path) == "/dev/null") if write else readable(path)
        if event in PATHS:
            return all(inside(args[i], None if j is None else args[j]) for i, j in PATHS[event])
        if event in ADDRESS:
            a = args[1]
            return a is None or (isinstance(a, (str, bytes)) and a[:1] not in ("", b"", "\0", b"\0") and inside(a))
        if event == "sqlite3.connect":
            db = fsdecode(args[0])
            return db in ("", ":memory:") or (not db.startswith("file:") and inside(db))
        if event == "import":
            return args[0] not in NO_IMPORT
        return args[1] == socket.AF_UNIX if event == "socket.__new__" else event not in DENY
    def hook(event, args):
        if not allowed(event, args):
            what = args[0] if args and isinstance(args[0], (str, bytes, int)) else ""
            raise PermissionError(f"sandbox: {event} {what!r} is not allowed")
    return hook

def no_subprocess(*args, **kwargs):
    raise PermissionError("sandbox: subprocesses are not allowed")

def main():
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    _posixsubprocess.fork_exec = no_subprocess  # it forks without raising an audit event
    src = sys.stdin.buffer.read().decode("utf-8", "replace")
    sys.argv, sys.modules["__main__"] = ["main.py"], (mod := types.ModuleType("__main__"))
    linecache.cache["main.py"] = (len(src), None, src.splitlines(True), "main.py")
    sys.addaudithook(make_hook(posix.getcwd(), str(posix.getpid())))
    try:
        exec(compile(src, "main.py", "exec"), mod.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        if isinstance(exc, MemoryError):
            mod.__dict__.clear()  # free the user's objects so the traceback can be printed
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "main.py":
            tb = tb.tb_next  # drop this prelude's frames
        traceback.print_exception(type(exc), exc, tb)
        sys.exit(1)

main()
"""
