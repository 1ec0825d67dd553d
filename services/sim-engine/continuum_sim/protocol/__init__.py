"""Pure protocol code: tokenizer, chat template, block hashes, KV-event wire encoding, API shapes."""
