"""Pure decoders and encoders: engine wire formats in, normalized shapes out. No I/O here."""
