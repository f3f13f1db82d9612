#!/usr/bin/env bash
# Session 11's first device call: on an H200 the rule sweep (v83) first, the question only an H200 answers; on any
# other GPU the whole suite and the A/B of v84 (v82_device.sh). The second call runs the other one on the warm machine.
#   bash bench/tools/s11_device.sh
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  LIMIT_S=${LIMIT_S:-330} bash "$(dirname "$0")/v83_device.sh"
else
  LIMIT_S=${LIMIT_S:-420} bash "$(dirname "$0")/v82_device.sh"
fi
