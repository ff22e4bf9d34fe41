"""A kubelet that runs pods as local processes (see ``kubelet.ProcessKubelet``)."""

from .kubelet import KubeletConfig, ProcessKubelet

__all__ = ["KubeletConfig", "ProcessKubelet"]
