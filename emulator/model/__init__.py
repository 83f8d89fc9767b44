"""The fabric model and the formats every layer reads: pure, no root, imports nothing else of ours."""
