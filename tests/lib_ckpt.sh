# Sourced by tests that compare checkpoints: ckpt_state_eq A B is true when the two checkpoints
# hold bitwise the same state (model, optimizer, step, data position). Each checkpoint also keeps
# its own run's settings (output paths, ...) after its 1024-byte header (their length at byte
# 768) and a trailer of 24 bytes whose crc covers them: compared are the bytes between.
ckpt_state_eq() {
  local a b sa sb
  a=$(( 1024 + $(od -An -tu4 -j768 -N4 "$1") )) && b=$(( 1024 + $(od -An -tu4 -j768 -N4 "$2") )) || return 1
  sa=$(( $(stat -c %s "$1") - a - 24 )); sb=$(( $(stat -c %s "$2") - b - 24 ))
  [ "$sa" = "$sb" ] && [ "$sa" -gt 0 ] && cmp -s -n "$sa" -i "$a:$b" "$1" "$2" \
    && cmp -s -n 768 "$1" "$2" # the header before the settings' length: step, data position, shapes
}
