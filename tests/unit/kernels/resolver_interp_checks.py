"""Child process (TRITON_INTERPRET=1): the Triton resolver kernel against the LRU oracle, in
lockstep with the torch path (identical outputs and state every step), and alternating with it
on one buffer. Run by test_resolver_triton.py."""
from tests.unit.kernels.interp_runner import report
from tests.unit.kernels.lru_scenarios import INTERP_STEPS, SCENARIOS, run_scenario

if __name__ == "__main__":
    for name in sorted(SCENARIOS):
        report(f"lockstep:{name}", lambda: run_scenario(name, backends=("triton", "torch"),
                                                        lockstep=True, steps=INTERP_STEPS[name]))
    for name in ("fast_to_slow", "padded_rows"):
        report(f"alternating:{name}", lambda: run_scenario(name, backends=("triton", "torch"),
                                                           steps=INTERP_STEPS[name]))
