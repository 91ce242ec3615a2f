"""cuDNN knobs: Paddle flags on GPU, skipped on CPU (there is no cuDNN, and CPU builds of Paddle do
not even define these flags).

- cudnn_exhaustive_search -> FLAGS_cudnn_exhaustive_search: try every convolution algorithm
  once per shape and keep the fastest (slow first steps, faster later ones);
- conv_workspace_size_limit (MiB) -> FLAGS_conv_workspace_size_limit: the scratch memory a
  convolution algorithm may use (larger allows faster algorithms);
- cudnn_batchnorm_spatial_persistent -> FLAGS_cudnn_batchnorm_spatial_persistent: cuDNN's
  persistent batch-norm kernels (faster for NHWC, may overflow in fp16).
"""
from fleetlite.strategies.flag_knob import FlagKnob

NO_CUDNN = "no cuDNN on CPU: the flag exists only in CUDA builds of Paddle"


class CudnnExhaustiveSearch(FlagKnob):
    name = "cudnn_exhaustive_search"
    flag = "FLAGS_cudnn_exhaustive_search"
    devices = ("gpu",)
    elsewhere = NO_CUDNN


class ConvWorkspaceSizeLimit(FlagKnob):
    name = "conv_workspace_size_limit"
    flag = "FLAGS_conv_workspace_size_limit"
    devices = ("gpu",)
    elsewhere = NO_CUDNN


class CudnnBatchNormSpatialPersistent(FlagKnob):
    name = "cudnn_batchnorm_spatial_persistent"
    flag = "FLAGS_cudnn_batchnorm_spatial_persistent"
    devices = ("gpu",)
    elsewhere = NO_CUDNN
