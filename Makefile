# The README's commands. Everything installs itself; downloads are cached outside the repository.
.PHONY: setup demo test unit fuzz lint kafka-start kafka-stop slurm-up slurm-down

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/peerwatch demo

test:
	bash scripts/test.sh

unit: setup
	.venv/bin/python -m pytest tests/unit

# The C Avro decoder built with ASan/UBSan, fuzzed against the Python reader (FUZZ_SECONDS, 120);
# then archive files, spool segments, Slurm JSON and Kafka messages mutated
# (FUZZ_INPUT_SECONDS, 60), with stage 2's compiled loops built to check every index (their own
# numba cache, apart from the unchecked build).
fuzz: setup
	bash scripts/fuzz_native.sh
	NUMBA_BOUNDSCHECK=1 NUMBA_CACHE_DIR=$${XDG_CACHE_HOME:-$$HOME/.cache}/peerwatch/numba-boundscheck \
		PYTHONPATH=. .venv/bin/python scripts/fuzz_inputs.py --seconds $${FUZZ_INPUT_SECONDS:-60} \
		$${FUZZ_SEED:+--seed $$FUZZ_SEED}

lint: setup
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy

kafka-start: setup
	.venv/bin/peerwatch kafka start

kafka-stop: setup
	.venv/bin/peerwatch kafka stop

slurm-up:
	bash scripts/slurm-up.sh

slurm-down:
	bash scripts/slurm-down.sh
