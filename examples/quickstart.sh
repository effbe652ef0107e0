#!/usr/bin/env bash
# The whole pipeline on an embedded default: export a reranker and an embedder, index this project's
# docs/ folder, and answer a question with hybrid retrieval + rerank, printing the explained results.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -f models/ms-marco-MiniLM-L-6-v2/manifest.json ]; then
    reranker=ms-marco-MiniLM-L-6-v2
elif hub_log=$(mktemp) && echo "quickstart: exporting cross-encoder/ms-marco-MiniLM-L-6-v2 from the Hugging Face Hub" \
    && onnxrank export --model cross-encoder/ms-marco-MiniLM-L-6-v2 --out models/ms-marco-MiniLM-L-6-v2 --quiet 2>"$hub_log"; then
    reranker=ms-marco-MiniLM-L-6-v2
else
    # the Hub client retries for ~20 s before giving up; its log is kept, not shown
    echo "quickstart: $(grep 'onnxrank export: error' "$hub_log" | cut -c1-160)... (full log: $hub_log)"
    echo "quickstart: the Hugging Face Hub is unreachable, so this run uses the offline stand-in"
    echo "quickstart: minilm-standin (all-MiniLM-L6-v2 encoder + fitted head): NOT a relevance model;"
    echo "quickstart: its rerank scores show the pipeline and its speed, not relevance."
    reranker=minilm-standin
    [ -f models/minilm-standin/manifest.json ] || onnxrank export --model minilm-standin --out models/minilm-standin
fi
[ -f models/minilm-embedder/manifest.json ] \
    || onnxrank export --model minilm-embedder --task embedding --out models/minilm-embedder

onnxrank index --source docs --index indexes/docs --embedder minilm-embedder
onnxrank query "how does onnxrank batch pairs by token budget" \
    --index indexes/docs --mode hybrid --rerank --model "$reranker" --k 5
