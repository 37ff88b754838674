# `sam build` (BuildMethod: makefile) runs `make build-<FunctionLogicalId>` with ARTIFACTS_DIR
# set; all three functions are the same binary, so each target builds (or reuses) it and copies
# the stripped, checked `bootstrap` there. AFTERGLOW_ARCH=arm64 for the arm64 Architecture.
AFTERGLOW_ARCH ?= x86_64

build-IngestFunction build-CompactFunction build-QueryFunction:
	infra/build-lambda $(AFTERGLOW_ARCH) "$(ARTIFACTS_DIR)"

.PHONY: build-IngestFunction build-CompactFunction build-QueryFunction
