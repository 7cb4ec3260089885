# JupyterHub for a class on one machine (deploy/README.md): start it as root with
#
#     COURSE_HUB_SSL_CERT=/etc/ssl/hub.crt COURSE_HUB_SSL_KEY=/etc/ssl/hub.key \
#       /opt/algebra-of-llms/bin/jupyterhub \
#       -f /opt/algebra-of-llms/course/deploy/jupyterhub_config.py
#
# where /opt/algebra-of-llms is the environment `python -m course.hub env /opt/algebra-of-llms`
# built (the `hub` profile of the course's learner edition, which it writes to .../course: no
# solution and no hidden test; readable by every user, with JupyterHub's proxy in its bin/).
#
# - Who logs in: the machine's own accounts (PAM: each student's Unix name and password), if
#   they are in the Unix group COURSE_HUB_GROUP or are instructors. Nobody is the hub's admin.
# - What each gets: their own JupyterLab, started as their Unix user in their home folder, from
#   the course's environment; before it starts, the hub closes the home to other users (0700).
#   Students get the learner's profile (course/lab.py: nbgrader's formgrader, Create Assignment
#   and course list off; the Assignments tab and Validate on); members of the hub group
#   "instructors" get the instructor's, whose formgrader works on their clone of the course
#   (COURSE_HUB_COURSE_DIR, read with the course's own nbgrader_config.py: limits, kernel
#   sandbox, solutions/ and exercises/), and the role "course-instructor": they may stop and start
#   the students' servers, never open them.
# - Every server reads one global nbgrader configuration: the course id of the course's
#   nbgrader_config.py, the exchange folder COURSE_HUB_EXCHANGE (root's, sticky; the course's
#   folder in it the first instructor's: course.hub.prepare_exchange) and the course's exchange
#   classes (course/grading/exchange.py: a submission its student's alone; collect refuses one
#   that is not its student's).
#
# Settings (environment variables when the hub starts; the defaults suit a real machine):
#   COURSE_HUB_ENV          the users' Python environment (default: the one running the hub)
#   COURSE_HUB_STATE        the hub's own files: database, cookie secret, the Jupyter
#                           configuration folders it writes for the users (/srv/algebra-of-llms)
#   COURSE_HUB_EXCHANGE     nbgrader's exchange (/srv/nbgrader/exchange)
#   COURSE_HUB_GROUP        the Unix group of the students who may log in (algebra-of-llms)
#   COURSE_HUB_INSTRUCTORS  comma-separated user names of the instructors (instructor); the first
#                           owns the course's folder in the exchange (releases and collects)
#   COURSE_HUB_COURSE_DIR   where each instructor's clone of the course is (~/algebra-of-llms)
#   COURSE_HUB_SSL_CERT     HTTPS: the certificate and its key (both, or neither); the hub then
#   COURSE_HUB_SSL_KEY      serves https://:8000. Without them it listens on 127.0.0.1:8000 only,
#                           over plain HTTP, for a reverse proxy on this machine that serves HTTPS.
# --JupyterHub.bind_url on the command line still chooses another address or port.
import os
import sys
from pathlib import Path

from course.grading.exchange import EXCHANGE_CLASSES
from course.hub import close_home, course_id, network_settings, prepare_exchange
from course.lab import write_profile

c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)


def setting(name: str, default: str) -> str:
    return os.environ.get(f"COURSE_HUB_{name}", "").strip() or default


ENV = Path(setting("ENV", sys.prefix))
STATE = Path(setting("STATE", "/srv/algebra-of-llms"))
EXCHANGE = Path(setting("EXCHANGE", "/srv/nbgrader/exchange"))
GROUP = setting("GROUP", "algebra-of-llms")
INSTRUCTORS = list(dict.fromkeys(filter(None, (name.strip() for name in setting(
    "INSTRUCTORS", "instructor").split(",")))))
COURSE_DIR = setting("COURSE_DIR", "~/algebra-of-llms")
INSTRUCTORS_GROUP = "instructors"
STUDENTS_GROUP = "students"
CONFIG_DIRS = STATE / "jupyter"             # readable by every user
HUB_DIR = STATE / "hub"                      # the hub's alone

# ---------------------------------------------------------------- the hub's own files
c.JupyterHub.db_url = f"sqlite:///{HUB_DIR / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(HUB_DIR / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(HUB_DIR / "jupyterhub-proxy.pid")
c.ConfigurableHTTPProxy.command = [str(ENV / "bin" / "configurable-http-proxy")]

# ---------------------------------------------------------------- where it listens
for name, value in network_settings(setting("SSL_CERT", ""), setting("SSL_KEY", "")).items():
    setattr(c.JupyterHub, name, value)

# ---------------------------------------------------------------- who logs in
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.allowed_groups = {GROUP}
c.Authenticator.allowed_users = set(INSTRUCTORS)
c.Authenticator.admin_users = set()           # nobody may open another's server
c.JupyterHub.admin_access = False
c.PAMAuthenticator.open_sessions = False      # no login session per server (none is needed)


def hub_groups(authenticator, handler, auth_model):
    """At each login, the hub group of the person: instructors or students (the hub's own
    groups, which the roles below and the choice of profile read)."""
    auth_model["groups"] = [INSTRUCTORS_GROUP if auth_model["name"] in INSTRUCTORS
                            else STUDENTS_GROUP]
    return auth_model


c.Authenticator.manage_groups = True
c.Authenticator.post_auth_hook = hub_groups
c.JupyterHub.load_roles = [{
    "name": "course-instructor",
    "description": "Stop and start the students' servers (a runaway kernel), without access "
                   "to them: no 'access:servers', so no file or notebook of theirs.",
    "scopes": [f"servers!group={STUDENTS_GROUP}", f"list:users!group={STUDENTS_GROUP}",
               f"read:users:activity!group={STUDENTS_GROUP}"],
    "users": INSTRUCTORS,
}]

# ---------------------------------------------------------------- what each user gets
c.JupyterHub.spawner_class = "localprocess"   # each server a process of its Unix user
c.Spawner.cmd = [str(ENV / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.start_timeout = 180                 # a shared machine can be slow to start a lab
c.Spawner.http_timeout = 180
c.Spawner.environment = {"PATH": os.pathsep.join([str(ENV / "bin"), "/usr/local/bin",
                                                  "/usr/bin", "/bin"])}


def write_config_dirs() -> None:
    """The Jupyter configuration folders every server reads (written afresh at each start):
    ``learner/`` and ``instructor/`` (course.lab's profiles), ``nbgrader/`` (the course id and
    the exchange, for everyone) and ``instructor-course/`` (the instructor's course)."""
    for profile in ("learner", "instructor"):
        write_profile(profile, CONFIG_DIRS / profile)
    common = CONFIG_DIRS / "nbgrader"
    common.mkdir(parents=True, exist_ok=True)
    (common / "nbgrader_config.py").write_text(
        "# Written by deploy/jupyterhub_config.py for every user's server.\n"
        "c = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.course_id = {course_id()!r}\n"
        f"c.Exchange.root = {str(EXCHANGE)!r}\n"
        + "".join(f"c.ExchangeFactory.{action} = {name!r}\n"
                  for action, name in EXCHANGE_CLASSES.items()), encoding="utf-8")
    course = CONFIG_DIRS / "instructor-course"
    course.mkdir(parents=True, exist_ok=True)
    (course / "nbgrader_config.py").write_text(
        "# Written by deploy/jupyterhub_config.py for the instructors' servers: the course's own\n"
        "# configuration, from the instructor's clone of the course.\n"
        "import os\n"
        "c = get_config()  # noqa: F821\n"
        f"course = os.path.join(os.path.expanduser({COURSE_DIR!r}), 'nbgrader_config.py')\n"
        "if os.path.isfile(course):\n"
        "    load_subconfig(course)  # noqa: F821\n", encoding="utf-8")
    for folder, _, files in os.walk(CONFIG_DIRS):
        os.chmod(folder, 0o755)
        for name in files:
            if name.endswith((".json", ".py")):
                os.chmod(os.path.join(folder, name), 0o644)


def is_instructor(user) -> bool:
    return any(group.name == INSTRUCTORS_GROUP for group in user.groups)


def before_spawn(spawner) -> None:
    """Before a server starts: its user's home closed to others, then the profile."""
    closed = close_home(spawner.user.name)
    if closed:
        spawner.log.warning("course hub: %s", closed)
    choose_profile(spawner)


def choose_profile(spawner) -> None:
    """The instructor's or the learner's configuration, then the global nbgrader settings (a
    user's own ~/.jupyter still comes first)."""
    if is_instructor(spawner.user):
        folders = ["instructor", "instructor-course", "nbgrader"]
    else:
        folders = ["learner", "nbgrader"]
    spawner.environment = {**spawner.environment, "JUPYTER_CONFIG_PATH": os.pathsep.join(
        str(CONFIG_DIRS / folder) for folder in folders)}


c.Spawner.pre_spawn_hook = before_spawn

HUB_DIR.mkdir(parents=True, exist_ok=True)
STATE.chmod(0o755)
HUB_DIR.chmod(0o700)
write_config_dirs()
prepare_exchange(EXCHANGE, course_id(), INSTRUCTORS[0])
