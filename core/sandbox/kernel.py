"""The jail a ``<python>`` tool process starts in: namespaces, uid map, mount view, seccomp.

:mod:`core.sandbox.run` runs this file as a script, ``python -I -S -B kernel.py
CONFIG`` (standard library only), and imports it for :data:`FEATURES`. Every isolation decision
here is the kernel's and is made before the tool interpreter starts, so nothing the tool code
does in Python (patching ``os``/``posixpath``, ctypes, C extensions) can undo it.

Process tree of one call::

    rollout process
     └─ supervisor   this script, host PID namespace, PR_SET_PDEATHSIG=SIGKILL
         └─ init     this script, PID 1 of a new PID namespace, PR_SET_PDEATHSIG=SIGKILL
             └─ tool python -I -S ..., PID 2, PR_SET_PDEATHSIG=SIGKILL

* supervisor: a non-root caller first creates a user namespace whose only uid/gid, 65534
  ("nobody"), maps onto its own; then new network, IPC, UTS and PID namespaces (a root caller
  makes these as root); forks init and waits for it.
* init: a new mount namespace whose root is a small tmpfs holding read-only binds of ``/usr``,
  the ``/lib*`` dirs and the interpreter's prefix, five device nodes, ``/etc/ld.so.cache``, its
  own ``/proc`` (``subset=pid``) and a size-capped tmpfs workdir (``/sandbox``); ``pivot_root``
  into it. Privileges: a root caller drops the capability bounding set, switches to uid/gid
  65534 (so the kernel's permission checks see an unprivileged uid, not root) and then enters
  a user namespace mapping 65534 to 65534; nested user namespaces are capped at 0, every
  capability is dropped, ``no_new_privs`` is set and a seccomp filter installed. Then it forks
  the tool process and reaps until it exits. The mounts live only in this namespace, so
  nothing is left on the host when it dies, however it dies.
* tool: rlimits (address space, CPU, file size, open files, no core, ``RLIMIT_NPROC=0``), then
  ``execve`` of the interpreter.

Killing the supervisor kills init (parent-death signal), and init's death kills everything in
its PID namespace; init is not dumpable, so the tool (same uid) cannot ptrace it. Note that the
parent-death signal follows the *thread* that started the supervisor: ``run_python`` starts it
from its event loop's thread, which is alive for as long as the call is awaited.

Features are reported per name (:data:`FEATURES`). On a status pipe (``CONFIG["status_fd"]``,
close-on-exec, so the tool code never holds it) the jail writes ``missing NAME REASON`` for a
wanted feature it could not set up (when not required), ``fatal NAME REASON`` when setup
failed (nothing of the tool ran), and ``signal N`` when the tool was killed by signal N.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import resource
import select
import signal
import struct
import sys
from collections.abc import Callable

FEATURES: dict[str, str] = {
    "unprivileged-uid": "tool code runs as uid/gid 65534 (nobody) with no capabilities and "
    "no_new_privs",
    "pid-namespace": "own PID namespace: sees no other process, dies as a whole",
    "network-namespace": "own, empty network namespace (also scopes abstract unix sockets)",
    "ipc-namespace": "own System V IPC namespace",
    "mount-namespace": "private read-only root, size-capped tmpfs workdir, own /proc",
    "seccomp": "seccomp filter: no unix/packet/vsock sockets, mknod, ptrace, mount, "
    "namespaces, bpf, io_uring, keyrings, module loading",
}
NOBODY = 65534
WORKDIR = "/sandbox"

_libc = ctypes.CDLL(None, use_errno=True)
if sys.platform.startswith("linux"):  # elsewhere this module is only imported for its names
    _ulong, _str = ctypes.c_ulong, ctypes.c_char_p
    _libc.mount.argtypes = [_str, _str, _str, _ulong, _str]
    _libc.umount2.argtypes = [_str, ctypes.c_int]
    _libc.unshare.argtypes = [ctypes.c_int]
    _libc.prctl.argtypes = [ctypes.c_int, _ulong, _ulong, _ulong, _ulong]
    _libc.syscall.restype = ctypes.c_long

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CLONE_NEWCGROUP = 0x02000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
ST_RELATIME = 4096  # statvfs's flag for MS_RELATIME
MNT_DETACH, AT_FDCWD, AT_RECURSIVE = 2, -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC = 1, 2, 4, 8
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_READ, PR_CAPBSET_DROP = 1, 4, 23, 24
PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 22, 38, 47, 4
SECCOMP_MODE_FILTER = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# Syscall numbers from the kernel headers (asm/unistd_64.h; asm-generic/unistd.h for aarch64).
_COMMON = {  # the same number on both
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "clone3": 435, "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443,
}  # fmt: skip
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": _COMMON | {
        "socket": 41, "clone": 56, "ioctl": 16, "mknod": 133, "mknodat": 259, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "kexec_load": 246,
        "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248,
        "request_key": 249, "open_by_handle_at": 304, "name_to_handle_at": 303, "reboot": 169,
        "swapon": 167, "swapoff": 168, "syslog": 103, "acct": 163, "quotactl": 179,
        "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159,
        "sethostname": 170, "setdomainname": 171, "lookup_dcookie": 212, "fanotify_init": 300,
        "vhangup": 153, "uselib": 134, "iopl": 172, "ioperm": 173,
    },
    "aarch64": _COMMON | {
        "socket": 198, "clone": 220, "ioctl": 29, "mknodat": 33, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268, "kexec_load": 104,
        "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "add_key": 217,
        "request_key": 218, "open_by_handle_at": 265, "name_to_handle_at": 264, "reboot": 142,
        "swapon": 224, "swapoff": 225, "syslog": 116, "acct": 89, "quotactl": 60,
        "settimeofday": 170, "clock_settime": 112, "clock_adjtime": 266, "adjtimex": 171,
        "sethostname": 161, "setdomainname": 162, "lookup_dcookie": 18, "fanotify_init": 262,
        "vhangup": 58,
    },
}  # fmt: skip
SYSCALLS["arm64"] = SYSCALLS["aarch64"]
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7, "arm64": 0xC00000B7}
_ALLOWED_SOCKET_FAMILIES = (2, 10, 16)  # AF_INET, AF_INET6, AF_NETLINK (if_nameindex)
_DENIED_CLONE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
) | CLONE_NEWCGROUP
_TIOCSTI = 0x5412
_EPERM, _ENOSYS = 1, 38


class SetupError(Exception):
    """A required feature could not be set up; nothing of the tool code runs."""

    def __init__(self, feature: str, reason: str) -> None:
        super().__init__(f"{feature}: {reason}")
        self.feature, self.reason = feature, reason


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    enc = os.fsencode
    rc = _libc.mount(
        enc(source) if source else None,
        enc(target),
        enc(fstype) if fstype else None,
        flags,
        enc(data) if data else None,
    )
    _check(rc, f"mount {target}")


def _syscall(name: str, *args: int | bytes) -> int:
    table = SYSCALLS.get(platform.machine())
    if table is None or name not in table:
        raise OSError(_ENOSYS, f"{name}: no syscall number for {platform.machine()}")
    values = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    return _check(_libc.syscall(ctypes.c_long(table[name]), *values), name)


def _prctl(option: int, arg: int = 0, what: str = "prctl") -> int:
    return _check(_libc.prctl(option, arg, 0, 0, 0), what)


# --- seccomp -------------------------------------------------------------------------------

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


def _arg_low(index: int) -> int:
    """Offset of the low 32 bits of syscall argument ``index`` in ``struct seccomp_data``."""
    return 16 + 8 * index + (4 if sys.byteorder == "big" else 0)


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter: deny (EPERM) what a tool process never needs, allow the rest."""
    nr, deny = SYSCALLS[machine], (_RET, 0, 0, _RET_ERRNO | _EPERM)
    prog = [(_LD_W_ABS, 0, 0, 4), (_JEQ, 1, 0, _AUDIT_ARCH[machine])]
    prog += [(_RET, 0, 0, _RET_KILL_PROCESS), (_LD_W_ABS, 0, 0, 0)]
    if machine == "x86_64":  # x32 ABI numbers (bit 30) would dodge the table below
        prog += [(_JGE, 0, 1, 0x40000000), deny]
    families = _ALLOWED_SOCKET_FAMILIES
    prog += [(_JEQ, 0, len(families) + 3, nr["socket"]), (_LD_W_ABS, 0, 0, _arg_low(0))]
    prog += [(_JEQ, len(families) - i, 0, fam) for i, fam in enumerate(families)]
    prog += [deny, (_RET, 0, 0, _RET_ALLOW)]
    for name, index, test, value in (
        ("clone", 0, _JSET, _DENIED_CLONE_FLAGS),
        ("ioctl", 1, _JEQ, _TIOCSTI),
    ):
        prog += [(_JEQ, 0, 4, nr[name]), (_LD_W_ABS, 0, 0, _arg_low(index)), (test, 0, 1, value)]
        prog += [deny, (_RET, 0, 0, _RET_ALLOW)]
    prog += [(_JEQ, 0, 1, nr["clone3"]), (_RET, 0, 0, _RET_ERRNO | _ENOSYS)]  # libc falls back
    for name in sorted(set(nr) - {"socket", "clone", "ioctl", "clone3"}):
        prog += [(_JEQ, 0, 1, nr[name]), deny]
    return [*prog, (_RET, 0, 0, _RET_ALLOW)]


def install_seccomp() -> None:
    """Install :func:`seccomp_program` for this machine (needs no_new_privs or CAP_SYS_ADMIN)."""
    machine = platform.machine()
    if machine not in _AUDIT_ARCH:
        raise OSError(_ENOSYS, f"no seccomp syscall table for {machine}")
    prog = seccomp_program(machine)
    filters = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *ins) for ins in prog))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog), ctypes.addressof(filters))
    rc = _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0)
    _check(rc, "prctl(PR_SET_SECCOMP)")


# --- capabilities and ids --------------------------------------------------------------------


def drop_capabilities(*, keep_current: bool = False) -> None:
    """Empty the bounding and ambient sets and (unless ``keep_current``) all the others."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) < 0:
            break  # past the last capability this kernel knows
        _prctl(PR_CAPBSET_DROP, cap, "prctl(PR_CAPBSET_DROP)")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL before 4.3: none
    if keep_current:
        return
    header = ctypes.create_string_buffer(struct.pack("Ii", _LINUX_CAPABILITY_VERSION_3, 0), 8)
    data = ctypes.create_string_buffer(24)  # two zeroed __user_cap_data_struct
    _check(_libc.capset(header, data), "capset")


def become_nobody() -> None:
    """As root: drop supplementary groups, then gid and uid, to 65534."""
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    _prctl(PR_SET_DUMPABLE, 1)  # else /proc/self/{uid,gid}_map stay root's


def _write(path: str, text: str, dir_fd: int | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# --- the mount view --------------------------------------------------------------------------


def _make_readonly(path: str, *, nodev: bool = True, noexec: bool = False) -> None:
    """Make the bind mount at ``path`` (and mounts below it) read-only and nosuid."""
    attrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | (MOUNT_ATTR_NODEV if nodev else 0)
    attrs |= MOUNT_ATTR_NOEXEC if noexec else 0
    attr = struct.pack("QQQQ", attrs, 0, 0, 0)
    try:
        _syscall("mount_setattr", AT_FDCWD, os.fsencode(path), AT_RECURSIVE, attr, len(attr))
        return
    except OSError as exc:
        if exc.errno != _ENOSYS:
            raise
    # Before Linux 5.12: remount the top mount only, keeping the flags a user namespace locks.
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (MS_NODEV if nodev else 0)
    flags |= MS_NOEXEC if noexec else 0
    have = os.statvfs(path).f_flag
    for st, ms in ((8, MS_NOEXEC), (4, MS_NODEV), (MS_NOATIME, MS_NOATIME)):
        flags |= ms if have & st else 0
    flags |= MS_NODIRATIME if have & MS_NODIRATIME else 0
    flags |= MS_RELATIME if have & ST_RELATIME else 0
    _mount(None, path, None, flags)


def build_root(view: list[dict[str, str]], disk_bytes: int) -> None:
    """Build the tool's root on a tmpfs (in this mount namespace only) and pivot into it."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    base = "/tmp"  # any directory: the tmpfs hides it in this namespace only
    _mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=1024,mode=0755")
    try:
        _populate(base, view, disk_bytes)
    except BaseException:
        _libc.umount2(base.encode(), MNT_DETACH)  # the host's /tmp again, for a fallback workdir
        raise
    os.chdir(base)
    _syscall("pivot_root", b".", b".")
    _check(_libc.umount2(b".", MNT_DETACH), "umount2(old root)")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _populate(base: str, view: list[dict[str, str]], disk_bytes: int) -> None:
    for entry in view:
        kind, path = entry["kind"], entry["path"]
        target = base + path
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        if kind == "symlink":
            os.symlink(entry["target"], target)
            continue
        if kind == "dir":
            os.mkdir(target, 0o755)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        _mount(path, target, None, MS_BIND | MS_REC)
        _make_readonly(target, nodev=kind != "dev", noexec=kind == "dev")
    os.makedirs(f"{base}/dev", mode=0o755, exist_ok=True)
    for name, target in (("fd", ""), ("stdin", "/0"), ("stdout", "/1"), ("stderr", "/2")):
        os.symlink(f"/proc/self/fd{target}", f"{base}/dev/{name}")
    os.makedirs(f"{base}/etc", mode=0o755, exist_ok=True)
    for name, line in (
        ("passwd", f"nobody:x:{NOBODY}:{NOBODY}:nobody:{WORKDIR}:/usr/sbin/nologin\n"),
        ("group", f"nogroup:x:{NOBODY}:\n"),
    ):
        with open(f"{base}/etc/{name}", "w") as f:
            f.write(line)
    os.mkdir(f"{base}/proc", 0o555)
    proc_flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    try:  # only /proc/<pid> and self: no /proc/sys, kallsyms, ... (Linux 5.8+)
        _mount("proc", f"{base}/proc", "proc", proc_flags, "subset=pid")
    except OSError:
        _mount("proc", f"{base}/proc", "proc", proc_flags)
    os.mkdir(base + WORKDIR, 0o700)
    inodes = max(1024, disk_bytes // 16384)
    options = f"size={disk_bytes},nr_inodes={inodes},mode=0700,uid={NOBODY},gid={NOBODY}"
    _mount("tmpfs", base + WORKDIR, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options)


# --- the three processes ---------------------------------------------------------------------


class Jail:
    """Sets up the features in ``config["want"]``, in order, then runs the tool."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.want: set[str] = set(config["want"])
        self.required: set[str] = set(config["required"])
        self.status_fd: int = config["status_fd"]
        self.root = os.geteuid() == 0
        self.userns_error = ""  # why a non-root caller got no user namespace
        self.in_userns = False
        self.sysctl_dir = -1  # /proc/sys/user of the host's procfs, opened before the pivot
        self.own_uts = False

    def report(self, line: str) -> None:
        os.write(self.status_fd, (line.replace("\n", " ") + "\n").encode())

    def attempt(self, feature: str, step: str, action: Callable[[], object]) -> bool:
        """Run ``action`` for ``feature``; a failure is fatal if required, else reported."""
        if feature not in self.want:
            return False
        if self.userns_error and feature != "seccomp":
            reason = f"needs a user namespace ({self.userns_error})"
        else:
            try:
                action()
                return True
            except OSError as exc:
                reason = f"{step}: {exc.strerror or exc}"
        if feature in self.required:
            raise SetupError(feature, reason)
        self.want.discard(feature)
        self.report(f"missing {feature} {reason}")
        return False

    def supervise(self) -> None:
        """Enter the namespaces, fork init and mirror its exit."""
        os.set_inheritable(self.status_fd, False)
        os.umask(0o022)
        if not self.root:  # the user namespace is what lets us do the rest
            try:
                self.enter_user_namespace(os.getuid(), os.getgid())
            except OSError as exc:
                self.userns_error = f"unshare(CLONE_NEWUSER): {exc.strerror or exc}"
        for feature, flag, name in (
            ("network-namespace", CLONE_NEWNET, "CLONE_NEWNET"),
            ("ipc-namespace", CLONE_NEWIPC, "CLONE_NEWIPC"),
            ("pid-namespace", CLONE_NEWPID, "CLONE_NEWPID"),
        ):
            self.attempt(feature, f"unshare({name})", lambda f=flag: _unshare(f))
        self.own_uts = not self.userns_error and _libc.unshare(CLONE_NEWUTS) == 0
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != self.config["parent"]:
            os._exit(1)  # the caller died before the line above
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(alive_w)
            self.init(alive_r)
        for fd in (0, 1, 2, alive_r, self.status_fd):
            os.close(fd)
        _prctl(PR_SET_DUMPABLE, 0)  # no ptrace by same-uid processes
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        os._exit(os.waitstatus_to_exitcode(status))

    def enter_user_namespace(self, outer_uid: int, outer_gid: int) -> None:
        """A new user namespace whose only uid/gid, 65534, is ``outer_uid``/``outer_gid``."""
        _unshare(CLONE_NEWUSER)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{NOBODY} {outer_uid} 1\n")
        _write("/proc/self/gid_map", f"{NOBODY} {outer_gid} 1\n")
        self.in_userns = True

    def init(self, alive_r: int) -> None:
        """PID 1: mount view, privileges, seccomp; fork the tool; reap; report; exit."""
        self.check_supervisor(alive_r)
        cfg = self.config

        def mount_view() -> None:
            _unshare(CLONE_NEWNS)
            build_root(cfg["view"], cfg["disk_bytes"])

        # Opened now, while the host's /proc is visible; sysctls resolve per user namespace.
        self.sysctl_dir = -1
        with contextlib.suppress(OSError):
            self.sysctl_dir = os.open("/proc/sys/user", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        mounted = self.attempt("mount-namespace", "private mount view", mount_view)
        if self.own_uts:
            _libc.sethostname(b"sandbox", 7)
        self.attempt("unprivileged-uid", "drop privileges", self.drop_privileges)
        if self.sysctl_dir >= 0:
            os.close(self.sysctl_dir)
        _prctl(PR_SET_NO_NEW_PRIVS, 1, "prctl(PR_SET_NO_NEW_PRIVS)")
        self.attempt("seccomp", "install the seccomp filter", install_seccomp)
        self.check_supervisor(alive_r)  # again: changing uid cleared the parent-death signal
        os.close(alive_r)
        workdir = WORKDIR if mounted else cfg["host_workdir"]
        init_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            self.exec_tool(init_pid, workdir)
        for fd in (0, 1, 2):
            os.close(fd)
        _prctl(PR_SET_DUMPABLE, 0)  # the tool (same uid) may not ptrace init, seccomp or not
        while True:  # reap everything; leave when the tool is gone
            child, status = os.wait()
            if child == pid:
                break
        if os.WIFSIGNALED(status):
            self.report(f"signal {os.WTERMSIG(status)}")
            os._exit(0)
        os._exit(os.waitstatus_to_exitcode(status))

    @staticmethod
    def check_supervisor(alive_r: int) -> None:
        """Die with the supervisor from now on; exit now if it is already gone."""
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if select.select([alive_r], [], [], 0)[0]:
            os._exit(1)  # EOF: the supervisor's end closed

    def drop_privileges(self) -> None:
        """Run as 65534 with no capabilities (root: drop, then a user namespace on top)."""
        if self.root:
            drop_capabilities(keep_current=True)  # needs CAP_SETPCAP: before setuid
            become_nobody()  # which clears the rest
            with contextlib.suppress(OSError):  # nested ones are then capped at 0
                self.enter_user_namespace(NOBODY, NOBODY)
        elif not self.in_userns:
            raise OSError(0, f"runs as host uid {os.getuid()}: {self.userns_error}")
        if self.in_userns:
            if self.sysctl_dir >= 0:  # tool code may not create nested user namespaces
                with contextlib.suppress(OSError):  # defence in depth; seccomp also denies
                    _write("max_user_namespaces", "0", dir_fd=self.sysctl_dir)
            drop_capabilities()  # a new user namespace starts with a full set

    def exec_tool(self, init_pid: int, workdir: str) -> None:
        """The tool process: limits, then the interpreter."""
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != init_pid:
            os._exit(1)
        for which, soft, hard in self.config["rlimits"]:
            resource.setrlimit(which, (soft, hard))
        os.chdir(workdir)
        argv, env = self.config["argv"], self.config["env"]
        os.execve(argv[0], argv, env)


def _unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def main(argv: list[str]) -> None:
    config = json.loads(argv[1])
    jail = Jail(config)
    try:
        jail.supervise()
    except SetupError as exc:
        jail.report(f"fatal {exc.feature} {exc.reason}")
    except BaseException as exc:  # noqa: BLE001 - anything else: report, run nothing
        jail.report(f"fatal setup {type(exc).__name__}: {exc}")
    os._exit(125)


if __name__ == "__main__":
    main(sys.argv)
