#!/bin/bash
# Prints the compute capability of this machine's first GPU without its dot (90 for sm_90), or
# nothing where there is no GPU or no nvidia-smi. Used by test.sh and gpu-check.sh.
command -v nvidia-smi >/dev/null || exit 0
nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '. '
exit 0
