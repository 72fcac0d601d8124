"""agentbox: the Python SDK of agentboxd (isolated, persistent workspaces for AI agents).

    from agentbox import Client

    with Client() as client:                      # $AGENTBOX_URL, $AGENTBOX_TOKEN
        with client.sessions.create("demo") as s: # destroyed on exit
            print(s.commands.run("echo hi").stdout)

:class:`AsyncClient` has the same surface with ``async``/``await``.
"""

from ._async import AsyncClient, AsyncSession, AsyncSessionPager
from ._async_files import AsyncFiles
from ._async_process import (
    AsyncCommands,
    AsyncLineChannel,
    AsyncProcess,
    AsyncProcesses,
    AsyncTerminal,
)
from ._sync import Client, Session, SessionPager
from ._sync_files import Files
from ._sync_process import Commands, LineChannel, Process, Processes, Terminal
from .errors import (
    AgentboxError,
    CommandError,
    Conflict,
    Forbidden,
    ImageError,
    InternalError,
    InvalidArgument,
    NotFound,
    NotSupported,
    QuotaExceeded,
    Timeout,
    TooBig,
    Unauthorized,
    Unavailable,
)
from .models import (
    Build,
    ClusterInfo,
    CommandResult,
    DirEntry,
    FileEvent,
    FileInfo,
    HealthReport,
    Usage,
    Image,
    Limits,
    Mount,
    MountsResult,
    NetworkPolicy,
    Node,
    OutputRecord,
    PackageResult,
    ProcessInfo,
    PullProgress,
    Runner,
    SessionInfo,
    Snapshot,
    Template,
    WriteInfo,
)

__version__ = "0.1.0"

__all__ = [
    "AgentboxError",
    "AsyncClient",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncLineChannel",
    "AsyncProcess",
    "AsyncProcesses",
    "AsyncSession",
    "AsyncSessionPager",
    "AsyncTerminal",
    "Build",
    "Client",
    "ClusterInfo",
    "CommandError",
    "CommandResult",
    "Commands",
    "Conflict",
    "DirEntry",
    "FileEvent",
    "FileInfo",
    "Files",
    "Forbidden",
    "HealthReport",
    "Usage",
    "Image",
    "ImageError",
    "InternalError",
    "InvalidArgument",
    "LineChannel",
    "Limits",
    "Mount",
    "MountsResult",
    "NetworkPolicy",
    "Node",
    "NotFound",
    "NotSupported",
    "OutputRecord",
    "PackageResult",
    "Process",
    "ProcessInfo",
    "Processes",
    "PullProgress",
    "QuotaExceeded",
    "Runner",
    "Session",
    "SessionInfo",
    "SessionPager",
    "Snapshot",
    "Template",
    "Terminal",
    "Timeout",
    "TooBig",
    "Unauthorized",
    "Unavailable",
    "WriteInfo",
]
