"""argv prefix that starts a command the way a terminal starts a foreground job: SIGINT and SIGQUIT at their
default dispositions, whatever the test process inherited.

A POSIX shell without job control starts an asynchronous command (`make test &`, `( … & )`) with SIGINT and
SIGQUIT ignored; a process keeps an ignored signal across fork and exec, and Python installs its KeyboardInterrupt
handler only when it finds SIGINT at SIG_DFL. So in a test run started that way every CLI a test starts ignores
Ctrl-C (its /proc status: SigIgn 0x1001006, SigCgt 0), and a test of what Ctrl-C does fails every time — seen in
test runs started in the background. Tests that send a terminal's signals start their process through this prefix
(coreutils env, 8.31 or later), so they prove the same thing however the suite was started.
"""

from __future__ import annotations

FOREGROUND = ["env", "--default-signal=INT,QUIT"]
