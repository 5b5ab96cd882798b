"""How the backbone's forward runs, apart from what it computes: under the
autocast it asks for (``autocast_dtype``), compiled by ``torch.compile``
with its fallback (``compile_cfg``, :mod:`.compile`), or replayed from CUDA
graphs (``cuda_graphs``, :mod:`.cuda_graphs`). The backbone calls
:func:`run_forward` once per forward; what this layer reads of the model
are those settings, what they left (``compile_failure``, the graphs in
``graphs`` and ``training_graphs``) and the computation itself,
``_forward_pyramid``."""
from .compile import compile_options
from .cuda_graphs import GraphedInference, GraphedTraining
from .forward import graphed, init_execution, run_forward

__all__ = ['GraphedInference', 'GraphedTraining', 'compile_options',
           'graphed', 'init_execution', 'run_forward']
