"""Builds a static `paddle.mean` (Paddle 3.3.1's binding then logs glog's "not support input out
tensor" line once per process), says so, and with --kill RANK that rank then SIGKILLs itself:
the failure report's last log line must be the script's, not Paddle's."""
import os
import signal
import sys

import paddle

paddle.enable_static()
paddle.mean(paddle.static.data("x", [4, 3], "float32"))
print("built a static mean", flush=True)
if sys.argv[1:] == ["--kill", os.environ["PADDLE_TRAINER_ID"]]:
    os.kill(os.getpid(), signal.SIGKILL)
