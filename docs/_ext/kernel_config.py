"""IPython kernel configuration of the docs build's notebook kernel (copied into its profile as
ipython_kernel_config.py by quiet_build.py).

myst-nb starts the kernel through jupyter_client, whose default transport is TCP on 127.0.0.1 (myst-nb offers no
setting to choose IPC), and ipykernel 7 then logs a warning that the connection is not encrypted, which a `-q` build
would print once per notebook. The kernel runs only the repository's own tutorials on this machine; the warning is
dropped, by its text, from the kernel application's log. Everything else the kernel logs still shows, and a cell
that raises still fails the build (nbclient reads that from the cell's output, not from this log)."""
import logging


class _NoTransportNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "running over TCP without encryption" not in record.getMessage()


logging.getLogger("IPKernelApp").addFilter(_NoTransportNotice())
