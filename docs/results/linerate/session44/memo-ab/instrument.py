"""Patch dataplane/swarm.py in a worktree: count session.requests CPU, calls, memo hits."""
import sys
p = sys.argv[1] + "/tensorhub/dataplane/swarm.py"
s = open(p).read()
old = "    while not planner.done:\n        driver.perform(session.requests(time.monotonic()))\n"
assert old in s
s = s.replace(old, """    _st = [0, 0, 0.0]  # calls, memo answers, requests CPU seconds
    while not planner.done:
        _q = time.thread_time()
        _nd = getattr(planner, "next_due", None)
        _st[1] += bool(_nd is not None and _nd() > planner.now)
        driver.perform(session.requests(time.monotonic()))
        _st[0] += 1
        _st[2] += time.thread_time() - _q
""")
old = "@dataclass\nclass HeldOff:"
s = s.replace(old, "", 0)
# write stats at loop end
old2 = """                if on_chunk is not None:
                    on_chunk(replica, chunk)
"""
assert s.count(old2) == 1
s = s.replace(old2, old2 + """    import os as _os
    with open(f"/tmp/s44/loop/{_os.getpid()}.txt", "a") as _f:
        _f.write(f"calls {_st[0]} memo {_st[1]} requests_cpu {_st[2]:.3f}\\n")
""")
open(p, "w").write(s)
