package io.pymq.routing;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;

/**
 * MurmurHash3_x86_32 (Austin Appleby, SMHasher, public domain) exactly as spec/routing.md §1 writes it,
 * and the group hash {@code murmur3(UTF8(key), 0)} that every pymq engine routes groups with.  Java has
 * no unsigned int: hashes are returned as {@code long} in [0, 2^32) so they compare as the spec does.
 * Vectors: spec/vectors/murmur3.json (and SMHasher's verification value 0xb0f57ee3).
 */
public final class Murmur3 {
    private static final int C1 = 0xcc9e2d51;
    private static final int C2 = 0x1b873593;

    private Murmur3() {
    }

    /** The unsigned 32-bit hash of {@code data} with {@code seed} (the low 32 bits of seed are used). */
    public static long hash(byte[] data, long seed) {
        return Integer.toUnsignedLong(hash32(data, (int) seed));
    }

    /** The same hash as a Java int (the bits; read it with {@link Integer#toUnsignedLong}). */
    public static int hash32(byte[] data, int seed) {
        int h = seed;
        int n = data.length;
        int blocks = n & ~3;
        for (int i = 0; i < blocks; i += 4) {
            int k = (data[i] & 0xff) | (data[i + 1] & 0xff) << 8 | (data[i + 2] & 0xff) << 16 | (data[i + 3] & 0xff) << 24;
            k *= C1;
            k = Integer.rotateLeft(k, 15);
            k *= C2;
            h ^= k;
            h = Integer.rotateLeft(h, 13);
            h = h * 5 + 0xe6546b64;
        }
        int tail = n & 3;
        if (tail > 0) {
            int k = 0;
            if (tail == 3) {
                k ^= (data[blocks + 2] & 0xff) << 16;
            }
            if (tail >= 2) {
                k ^= (data[blocks + 1] & 0xff) << 8;
            }
            k ^= data[blocks] & 0xff;
            k *= C1;
            k = Integer.rotateLeft(k, 15);
            k *= C2;
            h ^= k;
        }
        h ^= n;
        h ^= h >>> 16;
        h *= 0x85ebca6b;
        h ^= h >>> 13;
        h *= 0xc2b2ae35;
        h ^= h >>> 16;
        return h;
    }

    /** {@code murmur3(UTF8(key), 0)}: the routing layer's one hash (group ids, message and correlation ids). */
    public static long groupHash(String key) {
        return hash(utf8(key), 0);
    }

    /**
     * The UTF-8 bytes of a string of Unicode scalar values.  A lone surrogate cannot be routed
     * (spec/routing.md conventions): it raises instead of being replaced by '?'.
     */
    static byte[] utf8(String s) {
        try {
            ByteBuffer b = StandardCharsets.UTF_8.newEncoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .encode(java.nio.CharBuffer.wrap(s));
            byte[] out = new byte[b.remaining()];
            b.get(out);
            return out;
        } catch (CharacterCodingException e) {
            throw new IllegalArgumentException("cannot route a string holding a lone surrogate: " + s.length()
                    + " UTF-16 units", e);
        }
    }
}
