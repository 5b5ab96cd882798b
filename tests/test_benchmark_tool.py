"""tools/benchmark.py runs its measurements in fresh processes and writes the
table, the plot and the raw results (speed targets live there, not here)."""
import json

from conftest import run_tool


def test_benchmark_writes_table_plot_and_results(tmp_path):
    proc = run_tool('tools/benchmark.py', '--models', 'xcit_nano_12_p16',
                    '--sizes', '64x96', '--batch', '1', '--modes', 'infer',
                    'train', '--repeat', '1', '--warmup', '0', '--threads',
                    '1', '--out-dir', tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / 'results.json').read_text())
    assert results['matmul_gflops_per_s'] > 0
    infer, train = results['results']
    assert infer['mode'] == 'infer' and train['mode'] == 'train'
    assert infer['seconds'] > 0 and infer['peak_rss_gib'] > 0
    assert infer['gmac_per_image'] > 0 and 'error' not in train
    table = (tmp_path / 'results.md').read_text()
    assert '| xcit_nano_12_p16 | 64x96 | 1 | infer |' in table
    assert (tmp_path / 'results.png').stat().st_size > 0


def test_benchmark_rejects_unknown_model(tmp_path):
    proc = run_tool('tools/benchmark.py', '--models', 'alexnet',
                    '--out-dir', tmp_path)
    assert proc.returncode != 0 and "unknown model 'alexnet'" in proc.stderr
