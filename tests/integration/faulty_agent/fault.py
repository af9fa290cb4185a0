"""A deliberately faulty agent for failure tests.

It reads the ContainerInput like the real runner and looks at the newest
user message for a keyword; anything else is handed to the real runner.

  crash           exit 3 at once, no output
  partial-crash   one assistant reply, then exit 3 (no result event)
  garbage         lines that are not events, exit 0
  hang            sleep far past any time limit
  flaky N         crash on the first N attempts (counted in /workspace), then behave
  memhog          allocate memory until the container's limit stops it
  forge-send JID  claim a send_message to JID (bypassing the runner's own check), then finish
  forge-send-file plant a symlink to /etc/passwd and a FIFO in /workspace, claim send_file of
                  each and of ../../etc/passwd (bypassing the runner's own check), then finish
  spend-crash     first attempt: one request through the model gateway, then exit 3; later: the runner
"""

import json
import os
import subprocess
import sys
import time

# The input is stdin's first line; the host keeps stdin open for its beats
# (agent_runner/fence.py), so this front end must not read to the end.
raw = sys.stdin.buffer.readline()
data = json.loads(raw)
users = [m["content"] for m in data["messages"] if m["role"] == "user"]
text = users[-1] if users else ""
words = text.replace("@", " ").split()


def emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


if "crash" in words:
    print("fault: crashing on purpose", file=sys.stderr)
    sys.exit(3)
if "partial-crash" in words:
    emit({"type": "assistant", "text": "half an answer"})
    sys.exit(3)
if "garbage" in words:
    print("this is not an event", flush=True)
    print("{still not", flush=True)
    sys.exit(0)
if "hang" in words:
    time.sleep(3600)
if "memhog" in words:
    hog = []
    while True:
        hog.append(bytearray(16 * 1024 * 1024))
if "forge-send" in words:
    raw_words = text.split()  # chat ids keep their "@"
    target = raw_words[raw_words.index("forge-send") + 1]
    emit({"type": "send_message", "chat_jid": target, "text": "forged announcement"})
    emit({"type": "assistant", "text": "I tried"})
    emit({"type": "result"})
    sys.exit(0)
if "forge-send-file" in words:
    os.symlink("/etc/passwd", "/workspace/leak")
    os.mkfifo("/workspace/pipe")
    for path in ("leak", "pipe", "../../etc/passwd"):
        emit({"type": "send_file", "path": path, "caption": "forged"})
    emit({"type": "assistant", "text": "I tried"})
    emit({"type": "result"})
    sys.exit(0)
if "flaky" in words:
    n = int(words[words.index("flaky") + 1])
    counter = "/workspace/.flaky-attempts"
    seen = int(open(counter).read()) if os.path.exists(counter) else 0
    with open(counter, "w") as fh:
        fh.write(str(seen + 1))
    if seen < n:
        print(f"fault: flaky attempt {seen + 1} crashes", file=sys.stderr)
        sys.exit(3)

if "spend-crash" in words:
    marker = "/workspace/.spent"
    if not os.path.exists(marker):
        open(marker, "w").close()
        import socket

        body = json.dumps(
            {"model": data["model"]["model"], "max_tokens": 16, "messages": [{"role": "user", "content": "spend"}]}
        ).encode()
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(data["model"]["socket_path"])
        conn.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        while conn.recv(65536):
            pass
        print("fault: spent tokens, now crashing", file=sys.stderr)
        sys.exit(3)

# The real runner gets the input on a pipe that ends with it: no fence to watch there
# (this process is the container's PID 1; its exit ends the runner with it).
data.pop("host_fence_s", None)
proc = subprocess.run([sys.executable, "-m", "agent_runner"], input=json.dumps(data).encode())
sys.exit(proc.returncode)
