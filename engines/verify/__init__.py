"""The external verifiers, which alone decide s_gt: the code sandbox (`sandbox`: jobs in, observed values
out; `isolation`: bubblewrap / unshare / rlimit backends; `child`: the program that runs inside), the
comparison of observed with expected outputs (`outputs`), and the math checker (`mathcheck`). Untrusted
code never runs in the caller's process, and every decision about its output is taken outside the sandbox."""
