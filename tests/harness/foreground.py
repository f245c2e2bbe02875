"""argv prefix that starts a command the way a terminal starts a foreground job: SIGINT and SIGQUIT at their
default dispositions, whatever the test process has at that instant.

A process keeps an ignored signal across exec, and Python installs its KeyboardInterrupt handler only when it finds
SIGINT at SIG_DFL. A CI run caught a `dflashctl logs -f` that a pytest worker had just started with SIGINT and SIGQUIT
ignored (its /proc status: SigIgn 0x1001006, SigCgt 0) although the worker's own dispositions read the same before
and after every test: they were ignored only for a moment, while something else in the worker ran (glibc's system()
does exactly that, process-wide). Ctrl-C then never reached the command. Tests that send a terminal's signals start
their process through this prefix (coreutils env, 8.31 or later).
"""

from __future__ import annotations

FOREGROUND = ["env", "--default-signal=INT,QUIT"]
