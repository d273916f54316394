"""Speed and memory benchmarks of the plugin, each a module run from the repository root as
`python -m benchmarks.NAME`; they import each other, fairseq_entmax and fairseq, never examples/.
Their results, machine and command are in benchmarks/RESULTS.md."""
