"""Running an exported ONNX file on a CPU runtime (onnxruntime or
OpenVINO), and what the file records of its graph (``metadata_props``)."""
from typing import Callable, Dict, List, Optional

import numpy as np

RUNTIMES = ('onnxruntime', 'openvino')


def onnxruntime_session(path: str, threads: Optional[int] = None):
    """An onnxruntime CPU session of ``path`` (``threads`` intra-op threads,
    one inter-op thread)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options,
                                providers=['CPUExecutionProvider'])


def runtime_session(runtime: str, path: str, threads: Optional[int] = None
                    ) -> Callable[[np.ndarray], List[np.ndarray]]:
    """A callable ``f(numpy input) -> list of numpy outputs`` running the
    ONNX file on ``runtime`` (one of :data:`RUNTIMES`), in fp32; its
    ``input_shape`` is the file's input shape, ``None`` for each free
    dimension."""
    if runtime == 'onnxruntime':
        session = onnxruntime_session(path, threads)
        first = session.get_inputs()[0]

        def run(x):
            return session.run(None, {first.name: x})
        run.input_shape = [d if isinstance(d, int) else None
                           for d in first.shape]
        return run
    import openvino as ov
    config = {'INFERENCE_PRECISION_HINT': 'f32'}
    if threads:
        config['INFERENCE_NUM_THREADS'] = threads
    compiled = ov.Core().compile_model(path, 'CPU', config)
    request = compiled.create_infer_request()

    def run(x):
        results = request.infer([x])  # one inference, all outputs
        return [results[o] for o in compiled.outputs]
    run.input_shape = [d.get_length() if d.is_static else None
                       for d in compiled.inputs[0].get_partial_shape()]
    return run


def read_metadata(path: str) -> Dict[str, str]:
    """The ``metadata_props`` of an ONNX file (not its weights)."""
    import onnx
    model = onnx.load(path, load_external_data=False)
    return {p.key: p.value for p in model.metadata_props}
