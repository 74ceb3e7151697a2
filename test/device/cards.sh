# the two model cards' serve commands (../shared/docs/model-cards.md), verbatim, once for every
# device script: `. "$(dirname "$0")/cards.sh"` (before the script's cd), then from the repo root,
# with build/apps/ninfer-serve and the card's models/ path in place, always in the background:
#   card_serve_9b > out 2> err & pid=$!
# each function execs the card's command, so $! is the server's own pid (kill and wait reach the
# server, and wait gives its exit status); called in the foreground it would replace the script.

card_serve_9b() {
exec \
./build/apps/ninfer-serve models/qwen3_5_9b.ninfer \
  --model-id qwen3.5-9b \
  --max-context 16384 \
  --spec mtp --draft-tokens 3
}

card_serve_4b() {
exec \
./build/apps/ninfer-serve models/qwen3_5_4b.ninfer \
  --host 0.0.0.0 \
  --port 8000 \
  --vision \
  --max-context 262144 \
  --kv-capacity 262144 \
  --default-max-tokens 16384 \
  --max-concurrency 1 \
  --device-state-slots 4 \
  --host-state-slots 4 \
  --host-kv-mib 8192 \
  --prefill-chunk 4096 \
  --kv-dtype fp8 \
  --spec mtp \
  --lm-head-draft \
  --draft-tokens 3 \
  --top-k 20 \
  --top-p 0.95 \
  --temperature 0.01 \
  --preserve-thinking \
  --model-id Qwen3.5-4B
}
