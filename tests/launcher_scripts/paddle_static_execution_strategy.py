"""A Paddle 2 script's way to build an ExecutionStrategy, which Paddle 3 removed."""
import paddle

execution_strategy = paddle.static.ExecutionStrategy()
