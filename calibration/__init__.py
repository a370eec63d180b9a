"""Calibration: small PyTorch models that check the cost models against real runs.

Needs the optional ``calibrate`` extra (torch); the cost models themselves never import torch.
"""
