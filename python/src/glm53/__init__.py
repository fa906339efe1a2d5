"""glm53: serve GLM-5.3-Flash (EXL3) reproducibly on consumer GPUs with CPU expert offload."""

__version__ = "0.1.0"
