"""The zygote: a sandboxed process that has imported a kernel's modules once and forks each
kernel of a grade run from that state (run *inside* the zygote's sandbox as a script; the host's
side is ``zygote.py``, which says why and what is guaranteed).

Standard library only, and nothing of the ``course`` package (which the sandbox does not hold).
The zygote never runs a notebook's code: it imports, listens and forks. For each connection on
its socket it forks a *supervisor*, which

1. says hello (the host reads its pid from the socket's credentials and puts it in the kernel's
   memory cgroup), then waits for ``go``;
2. takes new mount, pid, network, IPC and UTS namespaces, and mounts a fresh tmpfs on ``/tmp``,
   on HOME and on ``/dev/shm`` (so nothing another kernel wrote is visible), with the kernel's
   own connection folder bound back at its path (the other kernels' folders stay hidden under the
   fresh ``/tmp``);
3. sets the rlimits and forks pid 1 of the new pid namespace, which mounts its own ``/proc``
   (it sees no other kernel's process), takes a user namespace of its own, drops every
   capability and forks the kernel, which closes every file but its stdio and becomes
   ``ipykernel`` with the request's arguments; pid 1 reaps orphans, as bwrap's does;
4. kills the kernel (and with it its pid namespace) when the host closes the connection, and
   reports the kernel's exit status when it ends by itself.
"""

import ctypes
import importlib
import importlib.util
import json
import os
import random
import re
import resource
import select
import signal
import socket
import sys
import threading

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAPABILITY_VERSION_3 = 0x20080522
PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")     # read-only, as bwrap leaves them

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source, target, fstype, flags, data=None) -> None:
    def raw(text):
        return None if text is None else os.fsencode(text)
    _check(_libc.mount(raw(source), raw(target), raw(fstype), flags, raw(data)),
           f"mount {target}")


def _tmpfs(path: str, size: int) -> None:
    _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=0755")


def _drop_capabilities() -> None:
    """No capability left: not in the bounding set, not ambient, not effective or permitted."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "drop capability")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient")
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(_libc.capset(header, data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no new privileges")


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall((json.dumps(message) + "\n").encode())


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            raise EOFError("the grader closed the connection")
        data += chunk
    return data


def _receive_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """The request (one JSON line) and the descriptors sent with it (the kernel's stdout and
    stderr)."""
    fds: list[int] = []
    message, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(8 * 4))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += list(memoryview(data).cast("i"))
    if not message.endswith(b"\n"):
        message += _read_line(conn)
    return json.loads(message), fds


def _private_view(request: dict, root: str) -> None:
    """The supervisor's new namespaces and mounts (see the module's doc, step 2); the kernel's
    folder must be a folder of the zygote's ``root``."""
    kernel_dir = request["kernel_dir"]
    if os.path.dirname(kernel_dir) != root or not os.path.isdir(kernel_dir):
        raise ValueError(f"the kernel's folder {kernel_dir} is not in {root}")
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
                         | CLONE_NEWUTS), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    home = request["home"]
    # What the zygote's sandbox bound under /tmp or HOME (the Python environment of a checkout
    # under /tmp, as a fresh clone in CI has it) is bound again, read-only, over the fresh tmpfs.
    kept = {point: os.open(point, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
            for point in _mounts_under(("/tmp", home), leave=root)}
    own = os.open(kernel_dir, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    _tmpfs("/tmp", request["tmp_bytes"])
    _tmpfs(home, request["tmp_bytes"])
    for point, fd in kept.items():
        os.makedirs(point, exist_ok=True)
        _bind_read_only(f"/proc/self/fd/{fd}", point)
        os.close(fd)
    os.makedirs(kernel_dir)
    _mount(f"/proc/self/fd/{own}", kernel_dir, None, MS_BIND)
    os.close(own)
    for folder in request["home_dirs"]:
        os.makedirs(folder, exist_ok=True)
    _tmpfs("/dev/shm", request["shm_bytes"])


def _bind_read_only(source: str, target: str) -> None:
    """``source`` (and the mounts below it) bound at ``target``, read-only."""
    _mount(source, target, None, MS_BIND | MS_REC)
    _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _mount_points() -> list[str]:
    """This process's mount points, shortest first."""
    with open("/proc/self/mountinfo") as f:
        return sorted({_unescape(line.split()[4]) for line in f}, key=len)


def _mounts_under(tops: tuple[str, ...], leave: str) -> list[str]:
    """The outermost mount points below any of ``tops`` but ``leave`` (and what is below it)."""
    found: list[str] = []
    for point in _mount_points():
        inside = any(point.startswith(top + "/") for top in tops)
        covered = any(point == other or point.startswith(other + "/")
                      for other in [*found, leave])
        if inside and not covered:
            found.append(point)
    return found


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes come as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _own_user(uid: int) -> None:
    """A user namespace of the kernel's own, in which it is ``uid`` (the zygote's user, 0 in
    the zygote's namespace, outside): it holds no capability over the zygote's mounts."""
    outside, outside_group = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER), "unshare user")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {outside} 1"),
                       ("gid_map", f"{uid} {outside_group} 1")):
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError as error:
            raise OSError(error.errno, f"writing {text!r} to /proc/self/{name}: "
                                       f"{error.strerror}") from None


def _die_with_parent(alive_fd: int) -> None:
    """SIGKILL when the parent ends (``alive_fd``: a pipe whose other end only the parent
    holds, readable once it has ended, which covers a parent gone before the prctl)."""
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent death signal")
    if select.select([alive_fd], [], [], 0)[0]:
        os._exit(1)


def _be_init(request: dict, stdio: list[int], alive_fd: int) -> None:
    """Pid 1 of the kernel's namespace, as bwrap's: its /proc, a user namespace of its own, no
    capabilities; then it forks the kernel (pid 2), reaps orphans, and ends with the kernel's
    exit status (which ends every process of the namespace)."""
    _die_with_parent(alive_fd)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_COVERED:
        path = f"/proc/{name}"
        if os.path.exists(path):
            _bind_read_only(path, path)
    _own_user(request["uid"])
    _drop_capabilities()
    init_gone, init_holds = os.pipe()
    kernel = os.fork()
    if kernel == 0:
        try:
            os.close(init_holds)
            _die_with_parent(init_gone)
            _become_kernel(request, stdio)
        except BaseException as error:           # on the grader's stderr, as a kernel's would
            os.write(2, f"the zygote's kernel did not start: {error!r}\n".encode())
        finally:
            os._exit(1)
    os.closerange(3, init_holds)
    os.closerange(init_holds + 1, 65536)
    while True:
        pid, status = os.wait()
        if pid == kernel:
            os._exit(max(0, os.waitstatus_to_exitcode(status)))


def _become_kernel(request: dict, stdio: list[int]) -> None:
    """In the kernel: no file of the zygote's, fresh random state; then ipykernel."""
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(stdio[0], 1)
    os.dup2(stdio[1], 2)                  # from here on, the grader's stderr is 2
    os.closerange(3, 65536)
    # A fresh interpreter seeds these from the system's entropy; a fork would share the zygote's.
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    os.chdir(request["cwd"])
    launcher = importlib.util.find_spec("ipykernel_launcher")   # what ``-m`` puts in argv[0]
    sys.argv = [launcher.origin if launcher else "ipykernel_launcher", *request["argv"]]
    from ipykernel import kernelapp
    kernelapp.launch_new_instance(argv=request["argv"])


def _supervise(conn: socket.socket, root: str) -> None:
    """The supervisor's life (the module's doc, steps 1 to 4)."""
    os.setsid()
    request, stdio = _receive_request(conn)
    _send(conn, {"hello": os.getpid()})
    if _read_line(conn).strip() != b"go":
        raise RuntimeError("the grader did not say go")
    _private_view(request, root)
    for name, limit in request["rlimits"].items():
        which = getattr(resource, name)
        hard = resource.getrlimit(which)[1]
        limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.setrlimit(which, (limit, limit))
    supervisor_gone, supervisor_holds = os.pipe()
    init = os.fork()
    if init == 0:
        try:
            conn.close()
            os.close(supervisor_holds)
            _be_init(request, stdio, supervisor_gone)
        except BaseException as error:           # on the grader's stderr, as a kernel's would
            os.write(stdio[1], f"the zygote's kernel did not start: {error!r}\n".encode())
        finally:
            os._exit(1)
    os.close(supervisor_gone)
    for fd in stdio:
        os.close(fd)
    _send(conn, {"kernel": init})
    ended = os.pidfd_open(init)
    while True:
        ready = select.select([conn, ended], [], [])[0]
        if ended in ready:
            status = os.waitpid(init, 0)[1]
            _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
            return
        if not conn.recv(4096):                      # the grader let go: the kernel ends
            os.kill(init, signal.SIGKILL)
            os.waitpid(init, 0)
            return


def _uncover_proc() -> None:
    """Remove the read-only covers bwrap put on parts of the zygote's /proc: a /proc with
    mounts on it cannot be mounted again in a new namespace (the kernel re-covers its own)."""
    for point in reversed(_mount_points()):
        if point.startswith("/proc/"):
            _check(_libc.umount2(os.fsencode(point), MNT_DETACH), f"umount {point}")


def _reap(signum, frame) -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def serve(socket_path: str, modules: list[str]) -> None:
    """Import ``modules``, listen on ``socket_path`` and fork a supervisor per connection."""
    for name in modules:
        importlib.import_module(name)
    _uncover_proc()
    if threading.active_count() != 1:
        raise RuntimeError(f"the zygote's imports started threads ({threading.enumerate()}): "
                           "a fork would not be a fresh interpreter")
    signal.signal(signal.SIGCHLD, _reap)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        try:
            conn, _ = listener.accept()
        except InterruptedError:
            continue
        pid = os.fork()
        if pid == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                listener.close()
                _supervise(conn, os.path.dirname(socket_path))
            except BaseException as error:              # told to the grader, which refuses
                try:
                    _send(conn, {"error": f"{type(error).__name__}: {error}"})
                except OSError:
                    pass
            finally:
                os._exit(0)
        conn.close()


if __name__ == "__main__":
    sys.path.pop(0)                       # this file's folder is not the kernel's
    serve(sys.argv[1], sys.argv[2].split(","))
