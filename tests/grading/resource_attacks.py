"""Submissions that try to take the grading machine's memory or disk, or to read the notebook being
graded, as test data (beside attacks.py, in the same form: its ``Attack`` and ``PROBE``).

tests/test_grading_sandbox.py grades them in ONE run (fixture ``greedy``) with honest students
before and after them, then checks that each ends with its own reason in the CSV, that the
honest students keep full marks and that the machine's free memory and disk are as before.
Every attack is a real notebook of 01_matmul, its answers filled in, with the attack cell added
before the first answer; the code is a template (``{course}``, ``{token}``, ``{grader_pid}``).

Classes, two or more of each:

- memory: memfd files written or mapped, anonymous shared maps, forked children: none of them
  counts in RLIMIT_DATA; the sandbox's memory cgroup (or the watchdog) stops the kernel, the
  notebook fails with "memory: ...";
- tmpfs: /tmp, the working directory (HOME) and /dev/shm filled past their size: the cell gets
  "No space left on device" (one file past RLIMIT_FSIZE: "File too large") and the notebook goes
  on to full marks;
- the read-only root: /var (bwrap's root tmpfs, unsized) and other top-level folders: "Read-only
  file system";
- the connection folder (the one host folder the kernel can write): many files, one big file,
  files deleted but held open: the watchdog stops the kernel, "disk: ...";
- the graded notebook (its hidden tests): looked for through /proc/self/cwd, /proc/1/cwd and the
  working directory: empty.
"""

from __future__ import annotations

from grading_attacks import HONEST, PROBE, Attack

MEMORY = "memory: the notebook's kernel went past its"
DISK = "disk: the kernel wrote more than"
NO_SPACE = "No space left on device"

CONNECTION_FOLDER = '''
import os, sys
folder = os.path.dirname(next(a for a in sys.argv if a.endswith("kernel.json")))
print("connection folder", folder, os.listdir(folder))
'''

FILL = '''
import os
chunk = b"f" * (32 * 2**20)             # under RLIMIT_FSIZE: the folder's size is what stops it
written = 0
for i in range(10_000):
    with open(os.path.join(FOLDER, f"fill{{i}}"), "wb") as f:
        f.write(chunk)
    written += len(chunk)
    print("wrote", written >> 20, "MiB", flush=True) if i % 8 == 0 else None
'''


def _fill(folder: str) -> str:
    """FILL writing into folder (a Python expression)."""
    return FILL.replace("FOLDER", folder)


RESOURCE_ATTACKS = [
    # ---------------------------------------------------------------- memory: killed, "memory:"
    Attack(
        "memfd_writes", "writes 32 MiB memfd files with os.write and keeps them open: no map, "
        "nothing RLIMIT_DATA or RLIMIT_AS counts",
        '''
import os
chunk, fds = b"m" * (32 * 2**20), []
while True:
    fd = os.memfd_create("hoard")
    os.write(fd, chunk)
    fds.append(fd)
''', 0.0, reason=MEMORY, fails=True),
    Attack(
        "memfd_maps", "sizes memfd files with ftruncate, maps them shared, closes the fds and "
        "fills the maps",
        '''
import mmap, os
size, maps = 48 * 2**20, []
chunk = b"m" * size
while True:
    fd = os.memfd_create("hoard")
    os.ftruncate(fd, size)
    maps.append(mmap.mmap(fd, size))
    os.close(fd)
    maps[-1].write(chunk)
''', 0.0, reason=MEMORY, fails=True),
    Attack(
        "shared_maps", "fills anonymous shared maps (mmap.mmap(-1, n): MAP_SHARED, shmem, not in "
        "RLIMIT_DATA)",
        '''
import mmap
maps, chunk = [], b"s" * (128 * 2**20)
while True:
    maps.append(mmap.mmap(-1, len(chunk)))
    maps[-1].write(chunk)
''', 0.0, reason=MEMORY, fails=True),
    Attack(
        "forks_hoarders", "forks children that each fill 700 MiB and sleep: each under every "
        "per-process limit, together past what the sandbox may hold (its address-space size: "
        "private memory of several processes adds up)",
        '''
import os, time
for _ in range(8):
    if os.fork() == 0:
        hoard = b"h" * (700 * 2**20)
        time.sleep(60)
        os._exit(0)
    time.sleep(0.3)
time.sleep(5)
''', 0.0, reason=MEMORY, fails=True),
    # ---------------------------------------------------------------- tmpfs: full, honest marks
    Attack(
        "fills_tmp", "writes 32 MiB files into /tmp until it is full",
        _fill('"/tmp"'), HONEST, reason=NO_SPACE),
    Attack(
        "fills_home", "writes 32 MiB files into its working directory (in HOME) until it is full",
        _fill('os.getcwd()'), HONEST, reason=NO_SPACE),
    Attack(
        "fills_shm", "writes 32 MiB files into /dev/shm (bwrap's /dev is an unsized tmpfs) until "
        "it is full",
        _fill('"/dev/shm"'), HONEST, reason=NO_SPACE),
    Attack(
        "writes_big_file", "writes one 1 GiB file into /tmp",
        '''
with open("/tmp/big", "wb") as f:
    f.write(b"b" * 2**30)
''', HONEST, reason="File too large"),
    # ---------------------------------------------------------------- the root: read-only
    Attack(
        "writes_var", "writes 1 GiB into /var, on bwrap's root tmpfs",
        '''
import os
os.makedirs("/var/cache/hoard", exist_ok=True)
with open("/var/cache/hoard/fill", "wb") as f:
    f.write(b"v" * 2**30)
''', HONEST, reason="Read-only file system"),
    Attack(
        "writes_top_folders", "writes into every top-level folder it can name",
        PROBE + '''
def _write(path):
    import os
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").write(b"x" * 2**20)
for path in ("/planted", "/etc/planted", "/opt/planted", "/home/planted", "/dev/planted",
             "/run/planted/x", "/srv/planted/x"):
    _attack("write_root " + path, lambda: _write(path))
''', HONEST),
    # ---------------------------------------------------------------- the connection folder
    Attack(
        "floods_connection_folder", "writes 32 MiB files into its kernel's connection folder "
        "(bound read-write from the grader's /tmp)",
        CONNECTION_FOLDER + _fill("folder"), 0.0, reason=DISK, fails=True),
    Attack(
        "big_file_in_connection_folder", "writes one 1 GiB file into its connection folder, then "
        "sleeps (RLIMIT_FSIZE stops the file at its limit, the folder's cap stops the kernel)",
        CONNECTION_FOLDER + '''
import time
try:
    with open(os.path.join(folder, "big"), "wb") as f:
        f.write(b"b" * 2**30)
finally:
    time.sleep(5)
''', 0.0, reason=DISK, fails=True),
    Attack(
        "hides_in_connection_folder", "writes files of its connection folder, deletes them and "
        "keeps them open (the folder looks empty)",
        CONNECTION_FOLDER + '''
import time
held = []
for i in range(100):
    f = open(os.path.join(folder, f"hidden{{i}}"), "wb")
    os.unlink(f.name)
    f.write(b"h" * (32 * 2**20))
    f.flush()
    held.append(f)
time.sleep(5)
''', 0.0, reason=DISK, fails=True),
    # ---------------------------------------------------------------- the graded notebook
    Attack(
        "reads_graded_notebook", "looks for the notebook being graded (its hidden tests restored) "
        "through /proc/self/cwd, /proc/1/cwd, the working directory and every folder it can list",
        PROBE + '''
import glob, os
def _read(pattern):
    found = glob.glob(pattern, recursive=True)
    if not found:
        raise FileNotFoundError(f"nothing matches {{pattern}}")
    print(found, open(found[0]).read()[:100])
# the graded notebook is matmul.ipynb; a library's own notebooks (a Python environment under /tmp,
# as in a fresh clone there, is bound into the sandbox) are public and not what is looked for
_attack("cwd_notebook", lambda: _read("/proc/self/cwd/*.ipynb"))
_attack("init_cwd_notebook", lambda: _read("/proc/1/cwd/*.ipynb"))
_attack("work_notebook", lambda: _read("/home/learner/work/*"))
_attack("any_notebook", lambda: _read("/home/**/matmul.ipynb"))
_attack("tmp_notebook", lambda: _read("/tmp/**/matmul.ipynb"))
def _hidden():
    for top in ("/home", "/tmp", "/opt", "/proc/self/cwd", "/proc/1/cwd", "/proc/1/root/home"):
        for folder, _, files in os.walk(top):
            for name in files:
                if not name.endswith(".ipynb"):      # the graded notebook, by any name
                    continue
                try:
                    text = open(os.path.join(folder, name), errors="replace").read()
                    if "BEGIN HIDDEN" + " TESTS" in text and "test_matmul" + "_hidden" in text:
                        return print(os.path.join(folder, name))
                except OSError:
                    pass
    raise FileNotFoundError("no file holds the hidden tests")
_attack("hidden_tests", _hidden)
''', HONEST),
]
"""The resource attacks, graded together in one run with honest students."""

PROBES = ("cwd_notebook", "init_cwd_notebook", "work_notebook", "any_notebook", "tmp_notebook",
          "hidden_tests", *(f"write_root {path}" for path in (
              "/planted", "/etc/planted", "/opt/planted", "/home/planted", "/dev/planted",
              "/run/planted/x", "/srv/planted/x")))
"""Every probe (``ATTACK <name> BLOCKED``) the run must show blocked."""
