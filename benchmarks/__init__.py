"""Speed and memory benchmarks of the plugin: five programs run from the repository root as
`python -m benchmarks.NAME` (maps, attention, translation, huggingface, gpu_check), the other
modules their measurements; they import each other, fairseq_entmax and fairseq, never
examples/. Their results, machine and command are in benchmarks/RESULTS.md."""
