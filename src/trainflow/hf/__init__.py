"""Hugging Face's LlamaForCausalLM format, both ways, without torch: its parameter names and config.json (hf.llama),
the safetensors files of a folder checked from their headers (hf.weights), and a folder written all or nothing, in
shards with their index (hf.write). trainflow.preflight checks an io.init_from folder with them,
trainflow.checkpoint.hf_reader loads one, trainflow.export writes one.

    python -c "from trainflow.hf.llama import hf_name; print(hf_name('layers.3.attention.wq.weight'))"

This package imports no torch (the file-moving stages import it through the pre-flight checks), and nothing here:
import the module you need.
"""
