# `sam build` (BuildMethod: makefile) runs `make build-<FunctionLogicalId>` with ARTIFACTS_DIR
# set; every function is the same binary, so each target builds (or reuses) it and copies the
# stripped, checked `bootstrap` there. AFTERGLOW_ARCH=arm64 for the arm64 Architecture.
AFTERGLOW_ARCH ?= x86_64

FUNCTIONS := IngestFunction LogIngestFunction LogStoreFunction CompactFunction QueryFunction CatalogFunction

$(addprefix build-,$(FUNCTIONS)):
	infra/build-lambda $(AFTERGLOW_ARCH) "$(ARTIFACTS_DIR)"

.PHONY: $(addprefix build-,$(FUNCTIONS))
