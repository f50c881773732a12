"""The real data path: registry assets, tokenization into OLMo token files, and the data order."""
